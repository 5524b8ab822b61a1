// Package nodetest runs a node in-process for a test: node.Run, with test
// hooks (internal/nodehook), until the test ends. Node's tests and the
// relay's real-server tests share it, so that neither writes its own.
package nodetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/node"
)

// startWait bounds the wait for a node to serve.
const startWait = 30 * time.Second

// Run runs a node with cfg, opts (its Ready is replaced) and hooks, and
// returns its HTTP address once it serves, and a stop that ends it and
// waits for it. stop is idempotent and also runs when the test ends. An
// error of the node fails the test; so does a node that does not serve
// within 30 s.
func Run(t testing.TB, cfg node.Config, opts node.Options, hooks nodehook.Hooks) (httpAddr string, stop func()) {
	t.Helper()
	ready := make(chan string, 1)
	opts.Ready = func(a string) { ready <- a }
	ctx, cancel := context.WithCancel(nodehook.With(context.Background(), hooks))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := node.Run(ctx, cfg, opts); err != nil {
			t.Errorf("node %s: %v", cfg.NodeName, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	select {
	case httpAddr = <-ready:
		return httpAddr, stop
	case <-done:
		t.Fatalf("node %s stopped before it served", cfg.NodeName)
	case <-time.After(startWait):
		stop()
		t.Fatalf("node %s did not start within %v", cfg.NodeName, startWait)
	}
	return "", stop
}
