//go:build ordobench

package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestBenchHooks: ORDO_BENCH_UNSHARED_BUDGET=1, and only that, sets the
// node's UnsharedBudget hook, keeping the hooks the context already
// carries. It runs with go test -tags ordobench ./cmd/node.
func TestBenchHooks(t *testing.T) {
	base := nodehook.With(context.Background(), nodehook.Hooks{PerKeyLimit: 2})
	for v, want := range map[string]bool{"": false, "0": false, "true": false, "1": true} {
		lookup := func(k string) (string, bool) { return v, k == unsharedBudgetEnv && v != "" }
		h := nodehook.From(benchHooks(base, lookup, testkit.Logger(t, slog.LevelError)))
		if h.UnsharedBudget != want || h.PerKeyLimit != 2 {
			t.Errorf("%s=%q: hooks %+v, want UnsharedBudget %v and PerKeyLimit 2", unsharedBudgetEnv, v, h, want)
		}
	}
}
