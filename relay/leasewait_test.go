package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// TestLeaseLapsesDuringBrokerWait: "a check followed by an unbounded
// wait is not a check", on the real servers. Node "stale" reads
// a key's rows k and k+1 and starts publishing k, its lease checked; the
// broker's answers to it are held back (the proxy delays replies), so its
// first publish waits in the exchange check. Its database link is cut, so
// its lease lapses; node "next" claims the partition, k fails there until
// it is parked, an operator skips it, and "next" publishes k+1. Then the
// stale node's broker answers again. A consumer must never see k after
// k+1: the stale node must not send k once its lease deadline has passed.
func TestLeaseLapsesDuringBrokerWait(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	amqpProxy := testkit.NewProxy(t, strings.TrimSuffix(strings.TrimPrefix(testkit.AMQPURL(), "amqp://guest:guest@"), "/"))
	pgAddr := strings.TrimPrefix(strings.SplitN(strings.TrimPrefix(testkit.PostgresURL(), "postgres://"), "/", 2)[0], "postgres@")
	pgProxy := testkit.NewProxy(t, pgAddr)
	key := "lapse-" + uuid.NewString()

	watch := &watchedPub{key: key, keySeq: 1, returned: make(chan error, 16), settled: make(chan relay.Result, 16)}
	stale := h.startNode(nodeOpts{
		name: "stale", amqpURL: amqpProxy.URL(testkit.AMQPURL()), dbURL: pgProxy.URL(h.dbURL),
		// Neither the call timeout nor the heartbeat may end the wait
		// first: the lease deadline has to.
		callTimeout: time.Minute, heartbeat: time.Minute,
		wrapPub: func(p relay.Publisher) relay.Publisher { watch.Publisher = p; return watch },
	})
	t.Cleanup(func() { amqpProxy.DelayReplies(0); pgProxy.Restore() }) // before the node stops
	waitCond(t, 30*time.Second, "the stale node holds every partition", func() bool {
		return len(stale.leaser.Leases()) == testPartitions && stale.pub.Connected()
	})
	h.startNode(nodeOpts{name: "next", wrapPub: func(p relay.Publisher) relay.Publisher {
		return &nackKey{Publisher: p, key: key, keySeq: 1}
	}})

	amqpProxy.DelayReplies(time.Hour)
	ids := h.enqueue(h.msg(key, "order.placed", "t.v1"), h.msg(key, "order.cancelled", "t.v1"))
	k, next := ids[0], ids[1]
	waitCond(t, 30*time.Second, "the stale node publishes k", func() bool { return watch.entered() })
	pgProxy.Cut()

	// The new owner fails k until it is parked; the operator skips it.
	h.waitRows(30*time.Second, "k parked by the new owner", func(n int) bool { return n == 1 },
		"id = $1 AND parked_at IS NOT NULL", k)
	ctx := testkit.Context(t, 30*time.Second)
	if err := admin.NewStore(h.pool).Skip(ctx, admin.Actor{Operator: "tester", RemoteAddr: "test"}, k); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 30*time.Second, "k+1 delivered", func() bool { return delivered(h.checker, next.String()) })

	// The stale node's broker answers again: whatever it still does with
	// k, it does now.
	amqpProxy.DelayReplies(0)
	var err error
	select {
	case err = <-watch.returned:
	case <-time.After(30 * time.Second):
		t.Fatal("the stale node's publish of k did not return within 30s of the broker answering")
	}
	t.Logf("the stale node's publish of k returned %v", err)
	if err == nil {
		select {
		case res := <-watch.settled:
			t.Logf("and settled %v (%v)", res.Outcome, res.Err)
		case <-time.After(30 * time.Second):
			t.Fatal("the stale node's publish of k was never settled")
		}
	}
	// A queue is FIFO: once a marker published now is consumed, anything
	// the stale node had sent before it has been consumed too.
	marker := publishMarker(t, h.exchange)
	waitCond(t, 30*time.Second, "the marker consumed", func() bool { return delivered(h.checker, marker) })

	var order []int64
	for _, d := range h.checker.Deliveries() {
		if d.CorrelationID == key {
			order = append(order, d.KeySeq)
		}
	}
	t.Logf("key_seq of the key's deliveries, as consumed: %v", order)
	sawNext := false
	for _, s := range order {
		switch {
		case s == 2:
			sawNext = true
		case s == 1 && sawNext:
			t.Fatalf("k (key_seq 1) was delivered after k+1: the stale node published past its lease deadline (%v)", order)
		}
	}
}

// watchedPub passes every publish through, and reports what became of
// those of one key_seq of one key.
type watchedPub struct {
	relay.Publisher
	key      string
	keySeq   int64
	returned chan error
	settled  chan relay.Result

	mu    sync.Mutex
	calls int
}

func (w *watchedPub) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	if m.CorrelationID != w.key || m.KeySeq != w.keySeq {
		return w.Publisher.Publish(ctx, m, settle)
	}
	w.mu.Lock()
	w.calls++
	w.mu.Unlock()
	err := w.Publisher.Publish(ctx, m, func(res relay.Result) {
		select {
		case w.settled <- res:
		default:
		}
		settle(res)
	})
	select {
	case w.returned <- err:
	default:
	}
	return err
}

func (w *watchedPub) entered() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls > 0
}

// nackKey nacks every publish of one key_seq of one key.
type nackKey struct {
	relay.Publisher
	key    string
	keySeq int64
}

func (n *nackKey) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	if m.CorrelationID == n.key && m.KeySeq == n.keySeq {
		settle(relay.Result{Outcome: relay.Nacked, Err: errors.New("injected nack")})
		return nil
	}
	return n.Publisher.Publish(ctx, m, settle)
}

// delivered reports whether the checker has consumed message id.
func delivered(c *testkit.Checker, id string) bool {
	for _, d := range c.Deliveries() {
		if d.MessageID == id {
			return true
		}
	}
	return false
}

// publishMarker publishes a message to exchange with routing key
// "order.marker", waits for its confirm, and returns its message id.
func publishMarker(t *testing.T, exchange string) string {
	t.Helper()
	id := "marker-" + uuid.NewString()
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		ctx := testkit.Context(t, 30*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "order.marker", true, false,
			amqp.Publishing{MessageId: id, Body: []byte(`{}`)})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return errors.Join(errors.New("marker not confirmed"), err)
		}
		return nil
	})
	return id
}
