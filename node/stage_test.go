package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// order records the components that stopped, in order.
type order struct {
	mu      sync.Mutex
	stopped []string
}

func (o *order) add(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stopped = append(o.stopped, name)
}

func (o *order) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.stopped)
}

// waiter is a component that runs until its context ends, and records it.
func (o *order) waiter(name string, err error) component {
	return component{name, func(ctx context.Context) error {
		<-ctx.Done()
		o.add(name)
		return err
	}}
}

// TestStagesStopInReverse: stages stop one at a time, the last started
// first, each waited for before the next is told to stop; the errors
// components return when stopped are all reported.
func TestStagesStopInReverse(t *testing.T) {
	var o order
	running, fail := context.WithCancelCause(context.Background())
	defer fail(nil)
	st := &stages{fail: fail, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	settle := errors.New("unconfirmed at stop")
	st.start("services", o.waiter("broker", nil), o.waiter("http", nil))
	st.start("gossip", o.waiter("gossip", nil))
	st.start("leases", o.waiter("leases", nil))
	afterRelay := false
	st.start("relay", o.waiter("relay", settle)).after = func() {
		afterRelay = slices.Equal(o.get(), []string{"relay"})
	}
	err := st.stop()
	got := o.get()
	if !slices.Equal(got[:3], []string{"relay", "leases", "gossip"}) || len(got) != 5 {
		t.Fatalf("stopped in the order %v, want relay, leases, gossip, then the services", got)
	}
	if !afterRelay {
		t.Error("the relay stage's after hook did not run right after the relay stopped")
	}
	if !errors.Is(err, settle) || err.Error() != "relay: unconfirmed at stop" {
		t.Fatalf("stop = %v, want the relay's error, named", err)
	}
	if running.Err() != nil {
		t.Fatal("a component stopped when told to failed the node")
	}
}

// TestStageFailureStopsTheNode: a component that returns before its stage
// is stopped, with an error or without, fails the node (its context ends
// with that error as the cause), and stop reports it once.
func TestStageFailureStopsTheNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"error", errors.New("cannot join the cluster"), "gossip: cannot join the cluster"},
		{"nil", nil, "gossip: stopped before it was told to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o order
			running, fail := context.WithCancelCause(context.Background())
			defer fail(nil)
			st := &stages{fail: fail, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			st.start("services", o.waiter("broker", nil))
			st.start("gossip", component{"gossip", func(context.Context) error { return tc.err }})
			st.start("relay", o.waiter("relay", nil))
			select {
			case <-running.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("a failed component did not stop the node")
			}
			if cause := context.Cause(running); cause == nil || cause.Error() != tc.want {
				t.Fatalf("cause %v, want %q", cause, tc.want)
			}
			err := st.stop()
			if err == nil || err.Error() != tc.want {
				t.Fatalf("stop = %v, want %q once", err, tc.want)
			}
			if got := o.get(); !slices.Equal(got, []string{"relay", "broker"}) {
				t.Fatalf("stopped %v, want relay then broker", got)
			}
		})
	}
}
