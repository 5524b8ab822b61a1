//go:build !ordobench

package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestDefaultBuildReadsNoBenchSwitch: the node as users build it (no
// ordobench tag) ignores ORDO_BENCH_UNSHARED_BUDGET=1 and keeps the hooks
// the context carries.
func TestDefaultBuildReadsNoBenchSwitch(t *testing.T) {
	base := nodehook.With(context.Background(), nodehook.Hooks{PerKeyLimit: 2})
	lookup := func(k string) (string, bool) { return "1", k == "ORDO_BENCH_UNSHARED_BUDGET" }
	h := nodehook.From(benchHooks(base, lookup, testkit.Logger(t, slog.LevelError)))
	if h.UnsharedBudget || h.PerKeyLimit != 2 {
		t.Fatalf("hooks %+v, want UnsharedBudget false and PerKeyLimit 2", h)
	}
}
