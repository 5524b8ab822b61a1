// Package relayhook carries the relay's test hooks: settings no user may
// change, which tests in other packages (node's) need in order to show
// what the relay's rules prevent. They travel in the context given to
// relay.Relay.Run, as net/http/httptrace's hooks travel in a request's:
// the relay's public Config holds only what a user may set, and no program
// outside this module can import this package.
package relayhook

import "context"

type perKeyLimitKey struct{}

// WithPerKeyLimit returns ctx carrying a per-key limit of n for the relay
// run with it: up to n messages of one key in flight at once instead of
// 1. Above 1, per-key order is lost under nacks and returns; tests set it
// to show that the limit of 1 is what keeps it.
func WithPerKeyLimit(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, perKeyLimitKey{}, n)
}

// PerKeyLimit returns the per-key limit ctx carries: 1 (the relay's rule)
// unless WithPerKeyLimit set a higher one.
func PerKeyLimit(ctx context.Context) int {
	if n, ok := ctx.Value(perKeyLimitKey{}).(int); ok && n > 1 {
		return n
	}
	return 1
}
