//go:build !ordofaults

package main

import (
	"io"
	"strings"
	"testing"
)

// TestNoFaultFlags: the default build, the example consumer a user
// copies, has none of the fault injection's flags: each is refused as
// undefined, and -h lists none.
func TestNoFaultFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, args := range [][]string{{"-kill-after", "1"}, {"-handler-delay", "1s"}, {"-fault-error-rate", "0.1"},
		{"-fault-panic-rate", "0.1"}, {"-fault-poison-prefix", "p-"}} {
		_, err := parseConfig(args, none, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "flag provided but not defined") {
			t.Errorf("%q: %v, want undefined", args, err)
		}
	}
	var help strings.Builder
	_, _ = parseConfig([]string{"-h"}, none, &help)
	if h := help.String(); strings.Contains(h, "-fault-") || strings.Contains(h, "-kill-after") || strings.Contains(h, "-handler-delay") {
		t.Fatalf("-h lists fault injection:\n%s", help.String())
	}
}
