package main

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/node"
)

// env returns a lookup of the environment holding the pairs kv (name,
// value, name, value, ...).
func env(kv ...string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1], true
			}
		}
		return "", false
	}
}

// TestParseConfigSources: -source is repeatable, ORDO_SOURCES takes
// space-separated pairs, the command line beats the environment, a bad
// item is refused without quoting it (a URL may hold a password), every
// problem of the list is reported at -source, and -source with
// -postgres-url is refused, from flags or the environment.
func TestParseConfigSources(t *testing.T) {
	two := []node.Source{{Name: "default", PostgresURL: "postgres://h/a"}, {Name: "billing", PostgresURL: "postgres://h/b?sslmode=disable"}}
	for _, c := range []struct {
		name string
		args []string
		env  func(string) (string, bool)
		want []node.Source
		errs []string // substrings of the error; none: accepted
	}{
		{"flags", []string{"-source", "default=postgres://h/a", "-source", "billing=postgres://h/b?sslmode=disable"}, env(), two, nil},
		{"environment", nil, env("ORDO_SOURCES", "default=postgres://h/a  billing=postgres://h/b?sslmode=disable"), two, nil},
		{"flag beats environment", []string{"-source", "x=postgres://h/x"}, env("ORDO_SOURCES", "default=postgres://h/a"),
			[]node.Source{{Name: "x", PostgresURL: "postgres://h/x"}}, nil},
		{"ORDO_SOURCE is not read", nil, env("ORDO_SOURCE", "default=postgres://h/a"), nil, nil},
		{"not a pair", []string{"-source", "postgres://u:secret@h/a"}, env(), nil, []string{"-source (ORDO_SOURCES): a source without a name or a URL: want NAME=POSTGRES_URL"}},
		{"bad and repeated names", []string{"-source", "Billing=postgres://h/a", "-source", "a=postgres://h/a", "-source", "a=postgres://h/b"}, env(), nil,
			[]string{"2 problems", "-source (ORDO_SOURCES): source \"Billing\"", "-source (ORDO_SOURCES): source \"a\" is given twice"}},
		{"with -postgres-url", []string{"-postgres-url", "postgres://h/a", "-source", "b=postgres://h/b"}, env(), nil,
			[]string{"-postgres-url (ORDO_POSTGRES_URL) and -source (ORDO_SOURCES) are both set"}},
		{"with ORDO_POSTGRES_URL", []string{"-source", "b=postgres://h/b"}, env("ORDO_POSTGRES_URL", "postgres://h/a"), nil,
			[]string{"are both set"}},
	} {
		t.Run(c.name, func(t *testing.T) { checkSourcesParse(t, c.args, c.env, c.want, c.errs) })
	}
}

// checkSourcesParse parses args with env: with no errs expected it must
// give the sources want; else its error must say each of errs, and never
// show the password "secret".
func checkSourcesParse(t *testing.T, args []string, env func(string) (string, bool), want []node.Source, errs []string) {
	t.Helper()
	o, err := parseConfig(args, env, io.Discard)
	if len(errs) == 0 {
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(o.Sources, want) {
			t.Fatalf("sources %+v, want %+v", o.Sources, want)
		}
		return
	}
	if err == nil {
		t.Fatalf("accepted: %+v", o.Sources)
	}
	for _, w := range errs {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not say %q:\n%v", w, err)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("the error shows a password:\n%v", err)
	}
}
