package main

import (
	"bytes"
	stdctx "context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// runCommand runs the command line args as main does, with an empty
// environment, and returns the exit status main would exit with.
func runCommand(stdout, stderr io.Writer, args ...string) int {
	c := cli{lookup: func(string) (string, bool) { return "", false }, stdout: stdout, stderr: stderr}
	return exitStatus(c.run(stdctx.Background(), args), stderr)
}

// TestRunExitStatus: run returns errors instead of exiting, and
// exitStatus maps them to the statuses the command has always had: 2 for
// bad usage (a bad flag, a stray argument, an unusable setting, a
// subcommand's bad arguments), 1 for a failure, 0 for -h.
func TestRunExitStatus(t *testing.T) {
	closed := testkit.FreeAddr(t)
	for _, c := range []struct {
		name   string
		args   []string
		status int
		msg    string
	}{
		{"unknown flag", []string{"-bogus"}, 2, "node: flag provided but not defined: -bogus"},
		{"bad setting", []string{"-confirm-window", "0"}, 2, "-confirm-window (ORDO_CONFIRM_WINDOW): 0 is out of range 1..65535"},
		{"stray argument", []string{"stray"}, 2, `unexpected arguments: ["stray"]`},
		{"help", []string{"-h"}, 0, ""},
		{"subcommand unknown flag", []string{"status", "-bogus"}, 2, "node status: flag provided but not defined"},
		{"subcommand help", []string{"parked", "-h"}, 0, ""},
		{"subcommand bad arguments", []string{"skip", "-http", closed}, 2, "node skip: give exactly one message id"},
		{"subcommand failure", []string{"health", "-http", closed}, 1, "node health: Get"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			cl := cli{lookup: func(string) (string, bool) { return "", false }, stdout: &out, stderr: &errOut}
			err := cl.run(stdctx.Background(), c.args)
			if c.status != 0 && err == nil {
				t.Fatal("run returned nil, want an error")
			}
			errOut.Reset()
			if status := exitStatus(err, &errOut); status != c.status {
				t.Fatalf("exit status %d, want %d (err %v)", status, c.status, err)
			}
			if !strings.Contains(errOut.String(), c.msg) {
				t.Fatalf("exitStatus wrote %q, want %q", errOut.String(), c.msg)
			}
			if c.status == 0 && errOut.Len() > 0 {
				t.Fatalf("exitStatus wrote %q for status 0", errOut.String())
			}
		})
	}
}

// TestBinaryUsageExitStatus: the built binary, which exits in one place,
// exits 2 on a bad flag and on an unusable setting, and 0 on -h.
func TestBinaryUsageExitStatus(t *testing.T) {
	t.Parallel()
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	for _, c := range []struct {
		args   []string
		status int
	}{
		{[]string{"-bogus"}, 2},
		{[]string{"-partitions", "0", "-db-max-conns", "1"}, 2},
		{[]string{"retry", "-key", "k", "-error", "x"}, 2},
		{[]string{"-h"}, 0},
	} {
		p := testkit.StartProcess(t, "usage", bin, c.args, []string{"ORDO_POSTGRES_URL=" + closedPostgresURL(t)})
		status, err := p.Wait(15 * time.Second)
		if err != nil || status != c.status {
			t.Fatalf("node %q: exit %d (%v), want %d:\n%s", c.args, status, err, c.status, p.Output())
		}
	}
}

// TestParseConfigReportsEveryProblem: several unusable settings are
// reported at once, each by the flag that sets it.
func TestParseConfigReportsEveryProblem(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	_, err := parseConfig([]string{"-partitions", "0", "-db-max-conns", "1", "-confirm-window", "70000",
		"-retry-min", "2s", "-retry-max", "1s", "-amqp-url", "amqp://u:p%zz@h/", "-log-format", "xml", "stray"}, none, io.Discard)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"-partitions (ORDO_PARTITIONS)", "-db-max-conns (ORDO_DB_MAX_CONNS)",
		"-confirm-window (ORDO_CONFIRM_WINDOW)", "-retry-max (ORDO_RETRY_MAX)", "-amqp-url (ORDO_AMQP_URL)",
		"log-format", "unexpected arguments"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %s:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "p%zz") {
		t.Errorf("the error shows the AMQP password:\n%v", err)
	}
}

// flagTestValue returns, for flag f whose field currently holds v, a
// command-line value other than the default and the value it must set.
func flagTestValue(t *testing.T, f nodeFlag, v reflect.Value) (string, any) {
	t.Helper()
	switch p := v.Addr().Interface().(type) {
	case *int64: // read-ahead-mib: MiB on the command line, bytes in the field
		return "3", int64(3 << 20)
	case *string:
		return "set-by-" + f.name, "set-by-" + f.name
	case *int:
		return fmt.Sprint(*p + 7), *p + 7
	case *bool:
		return fmt.Sprint(!*p), !*p
	case *time.Duration:
		return (*p + 3*time.Second).String(), *p + 3*time.Second
	case *slog.Level:
		return "debug", slog.LevelDebug
	case *[]string:
		return " a:1, b:2 ,", []string{"a:1", "b:2"}
	case *[][]byte:
		return testGossipKey + "," + testGossipKey, [][]byte{[]byte("0123456789abcdef"), []byte("0123456789abcdef")}
	case *sourceCounts:
		return "a=8 b=16", sourceCounts{"a=8", "b=16"}
	case *[]node.Source:
		return "a=postgres://h/a b=postgres://h/b", []node.Source{{Name: "a", PostgresURL: "postgres://h/a"}, {Name: "b", PostgresURL: "postgres://h/b"}}
	}
	t.Fatalf("flag -%s: no test value for a field of type %s", f.name, v.Type())
	return "", nil
}

// TestFlagTableRoundTrip: every flag of the table, given on the command
// line or in its environment variable, sets its field, and only it; the
// command line beats the environment.
func TestFlagTableRoundTrip(t *testing.T) {
	for _, f := range nodeFlags {
		t.Run(f.name, func(t *testing.T) {
			want := defaultOptions()
			field := fieldByPath(reflect.ValueOf(&want).Elem(), f.field)
			arg, value := flagTestValue(t, f, field)
			field.Set(reflect.ValueOf(value))
			env := envOf(f.name)
			for _, c := range []struct {
				name string
				args []string
				env  map[string]string
			}{
				{"flag", []string{"-" + f.name + "=" + arg}, nil},
				{"environment", nil, map[string]string{env: arg}},
				{"flag beats environment", []string{"-" + f.name + "=" + arg}, map[string]string{env: "not a valid value"}},
			} {
				got := defaultOptions()
				fs := newNodeFlagSet(&got, io.Discard)
				lookup := func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }
				if err := envflag.Parse(fs, envPrefix, c.args, envLookup(lookup)); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: -%s=%q (%s) set\n%+v\nwant\n%+v", c.name, f.name, arg, env, got, want)
				}
			}
		})
	}
}

// TestFlagDefaults: with no flag and no environment, the node runs on
// node.DefaultConfig, whose nested configs are their packages' defaults
// (the node fills in only the broker URL), and -h shows every flag with
// its environment variable and that default.
func TestFlagDefaults(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	o, err := parseConfig(nil, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Config, node.DefaultConfig()) {
		t.Fatalf("defaults\n%+v\nwant node.DefaultConfig\n%+v", o.Config, node.DefaultConfig())
	}
	for _, c := range []struct {
		name      string
		node, pkg any
	}{
		{"Relay", o.Relay, relay.DefaultConfig()}, {"AMQP", o.AMQP, rabbitmq.DefaultConfig()}, {"Gossip", o.Gossip, membership.DefaultConfig()},
	} {
		n, p := reflect.ValueOf(c.node), reflect.ValueOf(c.pkg)
		for i := range n.NumField() {
			name := n.Type().Field(i).Name
			if c.name == "AMQP" && name == "ReconnectMax" {
				// 0: the lease timing rule's cap for -lease-ttl (lease.Timing).
				if !n.Field(i).IsZero() {
					t.Errorf("AMQP.ReconnectMax defaults to %v, want 0 (derived)", n.Field(i))
				}
				continue
			}
			if pf := p.FieldByName(name); pf.IsValid() && name != "URL" && !reflect.DeepEqual(n.Field(i).Interface(), pf.Interface()) {
				t.Errorf("%s.%s defaults to %v, its package to %v", c.name, name, n.Field(i), pf)
			}
		}
	}

	var help bytes.Buffer
	if status := runCommand(io.Discard, &help, "-h"); status != 0 {
		t.Fatalf("-h: exit %d", status)
	}
	d := defaultOptions()
	fs := newNodeFlagSet(&d, io.Discard)
	for _, f := range nodeFlags {
		def := fs.Lookup(f.name).DefValue
		line := fmt.Sprintf("-%s  (%s)\n", f.name, envOf(f.name))
		i := strings.Index(help.String(), line)
		if i < 0 {
			t.Errorf("-h does not list %q", line)
			continue
		}
		rest := help.String()[i+len(line):]
		rest, _, _ = strings.Cut(rest, "\n")
		if def != "" && !strings.HasSuffix(rest, fmt.Sprintf("(default %q)", def)) {
			t.Errorf("-h shows -%s as %q, want default %q", f.name, rest, def)
		}
	}
	for flag, want := range map[string]string{"confirm-window": "512", "read-ahead-mib": "16", "lease-ttl": "2s",
		"rejoin-interval": "10s", "confirm-timeout": "30s", "log-format": "auto"} {
		if got := fs.Lookup(flag).DefValue; got != want {
			t.Errorf("-%s default %q, want %q", flag, got, want)
		}
	}
}

// TestFlagTable: names and fields are unique, and every flag sets a field
// that exists (newNodeFlagSet panics otherwise).
func TestFlagTable(t *testing.T) {
	names, fields := map[string]bool{}, map[string]bool{}
	for _, f := range nodeFlags {
		if names[f.name] || fields[f.field] {
			t.Errorf("flag -%s (field %s) repeats a name or a field", f.name, f.field)
		}
		names[f.name], fields[f.field] = true, true
		if f.help == "" {
			t.Errorf("flag -%s has no help", f.name)
		}
	}
	o := defaultOptions()
	newNodeFlagSet(&o, io.Discard)
}

// TestReadmeListsEveryFlag: the flag table of README.md's "### `node`"
// section lists exactly the flags of the node.
func TestReadmeListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### `node`\n")
	if !ok {
		t.Fatal("README.md has no ### `node` section")
	}
	section, _, _ = strings.Cut(section, "\n\n#")
	var listed []string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `-") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		for _, m := range regexp.MustCompile("`-([a-z0-9-]+)`").FindAllStringSubmatch(first, -1) {
			listed = append(listed, m[1])
		}
	}
	var flags []string
	for _, f := range nodeFlags {
		flags = append(flags, f.name)
	}
	slices.Sort(listed)
	slices.Sort(flags)
	if !slices.Equal(listed, flags) {
		t.Fatalf("README.md lists\n%v\nthe node has\n%v", listed, flags)
	}
}
