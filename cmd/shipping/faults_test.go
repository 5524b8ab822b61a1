//go:build ordofaults

package main

import (
	"io"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/inboxfaults"
)

// TestFaultFlags: a shipping built with the ordofaults tag, as the tests
// and the bench build it, takes the fault injection's flags (and their
// ORDO_ variables) and refuses shares it cannot inject. It runs with
// go test -tags ordofaults ./cmd/shipping.
func TestFaultFlags(t *testing.T) {
	env := map[string]string{"ORDO_FAULT_PANIC_RATE": "0.02"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := parseConfig([]string{"-fault-error-rate", "0.03", "-fault-poison-prefix", "p-", "-handler-delay", "100ms",
		"-kill-after", "15"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := inboxfaults.Config{ErrorRate: 0.03, PanicRate: 0.02, PoisonPrefix: "p-", HandlerDelay: 100 * time.Millisecond, KillAfter: 15}
	if c.rig.Config != want {
		t.Fatalf("faults %+v, want %+v", c.rig.Config, want)
	}
	for _, args := range [][]string{{"-fault-error-rate", "-0.1"}, {"-fault-error-rate", "0.6", "-fault-panic-rate", "0.6"}} {
		if _, err := parseConfig(args, func(string) (string, bool) { return "", false }, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
