//go:build !ordobench

package main

import (
	"context"
	"log/slog"
)

// benchHooks returns ctx: the node as users build it reads no bench
// switch from its environment. The bench builds the node with the
// ordobench build tag, whose benchHooks (benchhook.go) reads one.
func benchHooks(ctx context.Context, _ func(string) (string, bool), _ *slog.Logger) context.Context {
	return ctx
}
