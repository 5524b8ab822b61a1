//go:build ordobench

package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/internal/nodehook"
)

// TestBenchHooks: ORDO_BENCH_UNSHARED_BUDGET=1, and only that, sets the
// node's UnsharedBudget hook, keeping the hooks the context already
// carries, and logs the "bench hook:" line the bench waits for. It runs
// with go test -tags ordobench ./cmd/node.
func TestBenchHooks(t *testing.T) {
	base := nodehook.With(context.Background(), nodehook.Hooks{PerKeyLimit: 2})
	for v, want := range map[string]bool{"": false, "0": false, "true": false, "1": true} {
		lookup := func(k string) (string, bool) { return v, k == unsharedBudgetEnv && v != "" }
		var log bytes.Buffer
		h := nodehook.From(benchHooks(base, lookup, slog.New(slog.NewTextHandler(&log, nil))))
		if h.UnsharedBudget != want || h.PerKeyLimit != 2 {
			t.Errorf("%s=%q: hooks %+v, want UnsharedBudget %v and PerKeyLimit 2", unsharedBudgetEnv, v, h, want)
		}
		// The bench's sources scenario waits for this line to know the
		// node took the switch (bench/sources_run.go).
		if logged := strings.Contains(log.String(), "bench hook:"); logged != want {
			t.Errorf("%s=%q: logged a bench hook line %v, want %v:\n%s", unsharedBudgetEnv, v, logged, want, log.String())
		}
	}
}
