package testkit

import (
	"testing"

	"github.com/ordo-relay/ordo/internal/childproc"
)

// FreeAddr returns "127.0.0.1:port" for a port on 127.0.0.1 that is free
// for both TCP and UDP at the time of the call (childproc.PickAddr),
// failing tb when there is none. Another process may take it before it is
// used; callers that can should listen on port 0 instead.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := childproc.PickAddr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}
