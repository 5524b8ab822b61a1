package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestReshardUnderLoad changes S from 2 to 3 and then to 2 again with the
// documented operation while a producer keeps publishing: every message is
// handled once, each key in order, and the old S is refused afterwards.
func TestReshardUnderLoad(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	grown := cfg
	grown.Shards = 3
	t.Cleanup(func() { deleteTopology(t, inbox.TopologyOf(grown)) })
	pub := newPublisher(t, cfg.Exchange)
	testkit.WithChannel(t, inbox.TopologyOf(cfg).Declare) // nothing published is lost before the first start

	var mu sync.Mutex
	want := map[string]int64{}
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("k%d", i%25)
			mu.Lock()
			want[key]++
			seq := want[key]
			mu.Unlock()
			pub.publish(key, seq)
			time.Sleep(2 * time.Millisecond)
		}
	})
	defer func() { stopLoad(); wg.Wait() }()

	steps := []inbox.Config{cfg, grown, cfg}
	for i, c := range steps {
		if i > 0 {
			rep := reshard(t, pool, c)
			t.Logf("reshard: %+v", rep)
		}
		r := startConsumer(t, c, fmt.Sprintf("a%d", i), pool, recordHandler("a"))
		r2 := startConsumer(t, c, fmt.Sprintf("b%d", i), pool, recordHandler("b"))
		testkit.WaitFor(t, 30*time.Second, "some handled", func() bool { return r.c.Stats().Handled+r2.c.Stats().Handled > 30 })
		r.stop(t)
		r2.stop(t)
	}
	stopLoad()
	wg.Wait()
	r := startConsumer(t, cfg, "final", pool, recordHandler("final"))
	mu.Lock()
	defer mu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			dumpState(t, pool, want)
		}
	})
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	t.Logf("gaps stored by the last instance: %d", r.c.Stats().GapsStored)

	_, err := inbox.Reshard(testkit.Context(t, 30*time.Second), pool, dial(t), grown)
	if !errors.Is(err, inbox.ErrInstancesRunning) {
		t.Fatalf("reshard with an instance running: %v", err)
	}
}

// reshard runs the documented operation once every instance has been
// stopped. A stopped instance's last heartbeat may still commit after its
// goodbye (a statement cancelled by the stop can commit on the server
// after the client gave up on it, and the goodbye runs on another
// connection): its member row then lives out its LeaseTTL, and Reshard
// refuses until it expires, as it would for an operator (a suite run under
// load saw it). So ErrInstancesRunning is tried again for twice LeaseTTL.
func reshard(t *testing.T, pool inbox.DB, cfg inbox.Config) inbox.ReshardReport {
	t.Helper()
	var rep inbox.ReshardReport
	var err error
	testkit.WaitFor(t, 2*cfg.LeaseTTL+10*time.Second, "reshard accepted", func() bool {
		rep, err = inbox.Reshard(testkit.Context(t, 30*time.Second), pool, dial(t), cfg)
		return !errors.Is(err, inbox.ErrInstancesRunning)
	})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func dumpState(t *testing.T, pool inbox.DB, want map[string]int64) {
	rows, err := pool.Query(context.Background(), `SELECT k.correlation_id, k.last_seq,
		coalesce((SELECT string_agg(m.key_seq || '/' || m.prev_seq || '/' || m.attempts || '/' || m.shard || '/' || coalesce(m.dead_at::text, '-') || '/' || m.next_attempt_at::text, ' ' ORDER BY m.key_seq)
		 FROM ordo_inbox_messages m WHERE m.consumer = k.consumer AND m.correlation_id = k.correlation_id), '')
		FROM ordo_inbox_keys k ORDER BY 1`)
	if err != nil {
		t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var k, stored string
		var last int64
		_ = rows.Scan(&k, &last, &stored)
		t.Logf("key %s last %d want %d stored %s", k, last, want[k], stored)
	}
}
