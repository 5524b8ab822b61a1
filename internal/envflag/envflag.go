// Package envflag gives every command-line flag an environment variable
// equivalent: flag "confirm-window" of a program with prefix "ORDO" reads
// ORDO_CONFIRM_WINDOW when the flag is not given on the command line.
// Flags beat the environment; the environment beats defaults.
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Name returns the environment variable for flag name under prefix.
func Name(prefix, flagName string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args into fs, then fills every flag that args did not set
// from its environment variable, looked up with lookup (os.LookupEnv when
// nil). A malformed environment value is an error naming the variable.
func Parse(fs *flag.FlagSet, prefix string, args []string, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		env := Name(prefix, f.Name)
		if v, ok := lookup(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// Usage returns a flag.Usage function that prints each flag with its
// environment variable.
func Usage(fs *flag.FlagSet, prefix, synopsis string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nFlags (each also read from the environment variable shown):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(w, "  -%s  (%s)\n    \t%s", f.Name, Name(prefix, f.Name), f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
	}
}
