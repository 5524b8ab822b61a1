//go:build ordobench

package main

import (
	"context"
	"log/slog"

	"github.com/ordo-relay/ordo/internal/nodehook"
)

// unsharedBudgetEnv, set to 1, runs a node of several sources without the
// relay.Budget its relays share: each has the node's full confirm window
// and read-ahead (nodehook.Hooks.UnsharedBudget). It is the A side of
// the bench's A/B of the Budget (bench sources -sources-budget, the only
// thing that sets it). Only a node built with the ordobench build tag,
// as the bench builds it, reads it (nobenchhook.go is the default
// build's benchHooks, which reads nothing); it is logged as a warning
// when set, since it lets a node of k sources have k × W messages
// unconfirmed.
const unsharedBudgetEnv = "ORDO_BENCH_UNSHARED_BUDGET"

// benchHooks returns ctx carrying the node's hooks that the bench sets
// through the environment; ctx itself when it sets none.
func benchHooks(ctx context.Context, lookup func(string) (string, bool), logger *slog.Logger) context.Context {
	if v, _ := lookup(unsharedBudgetEnv); v != "1" {
		return ctx
	}
	logger.Warn("bench hook: the sources' relays do not share the node's confirm window and read-ahead (each has all of it)", "env", unsharedBudgetEnv)
	h := nodehook.From(ctx)
	h.UnsharedBudget = true
	return nodehook.With(ctx, h)
}
