package inbox_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestStalledDeadLetterKeepsLeases: a
// dead-letter publish whose confirm cannot come (the broker's replies on
// the dead-letter connection stalled, through a proxy, the consumers'
// connection untouched) must not stop the lease renewals, nor the other
// shards' consumption; once the broker answers again the dead letter goes
// through.
func TestStalledDeadLetterKeepsLeases(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	cfg.MaxAttempts = 1
	cfg.Instance = "a"
	u, err := url.Parse(testkit.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testkit.NewProxy(t, u.Host)
	var poisonRuns atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.CorrelationID == "poison" || m.CorrelationID == "poison2" {
			poisonRuns.Add(1)
			return errors.New("poison")
		}
		return recordHandler("a")(ctx, tx, m)
	}
	c, err := inbox.New(cfg, pool, h)
	if err != nil {
		t.Fatal(err)
	}
	inbox.SetDeadLetterURL(c, proxy.URL(cfg.AMQPURL))
	r := runConsumer(t, c)
	testkit.WaitFor(t, 30*time.Second, "shards owned", func() bool { return len(r.c.Owned()) == 2 })
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("poison", 1) // dials the dead-letter connection
	testkit.WaitFor(t, 30*time.Second, "first dead letter", func() bool { return queueDepth(t, c.Topology().DeadQueue()) == 1 })
	// And recorded: its confirm came and its transaction committed. In the
	// queue is not enough: a stall before the confirm comes back fails the
	// first dead letter too, and it is dead-lettered again (a third in the
	// queue, where the test counts two).
	testkit.WaitFor(t, 30*time.Second, "first dead letter recorded", func() bool {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ordo_inbox_messages
			WHERE consumer = $1 AND correlation_id = 'poison' AND dead_at IS NOT NULL`, cfg.Name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})

	proxy.Stall()
	pub.publish("poison2", 1)
	testkit.WaitFor(t, 30*time.Second, "poison2 run", func() bool { return poisonRuns.Load() == 2 })
	// The dead-letter publish now waits for a confirm that cannot come.
	// For three lease TTLs, every lease must stay renewed and other keys
	// must be handled (on both shards: the one whose worker waits for the
	// confirm catches up after its deadline).
	want := map[string]int64{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		pub.publish(k, 1)
		want[k] = 1
	}
	ctx := testkit.Context(t, 30*time.Second)
	end := time.Now().Add(3 * cfg.LeaseTTL)
	for time.Now().Before(end) {
		var held int
		var expired bool
		if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(bool_or(expires_at < now()), false)
			FROM ordo_inbox_leases WHERE consumer = $1 AND owner = 'a'`, cfg.Name).Scan(&held, &expired); err != nil {
			t.Fatal(err)
		}
		if held != 2 || expired {
			t.Fatalf("while a dead-letter confirm is stalled: %d leases held, one expired %v: renewals stopped", held, expired)
		}
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Resume()
	testkit.WaitFor(t, 30*time.Second, "second dead letter", func() bool { return queueDepth(t, c.Topology().DeadQueue()) == 2 })
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	if len(r.c.Owned()) != 2 {
		t.Fatalf("owned %v, want both shards", r.c.Owned())
	}
}

// runConsumer runs c until tb ends.
func runConsumer(tb testing.TB, c *inbox.Consumer) *running {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	select {
	case <-c.Ready():
	case err := <-r.done:
		tb.Fatalf("consumer Run: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("consumer not ready within 30s")
	}
	tb.Cleanup(func() { r.stop(tb) })
	return r
}

// TestAMQPConfigUsedByEveryConnection: Config.AMQPConfig (here a Dial of
// the test's own; TLSClientConfig and the rest travel the same way) is
// used for the shard consumers' connection and the dead letters'.
func TestAMQPConfigUsedByEveryConnection(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	cfg.MaxAttempts = 1
	var dials atomic.Int32
	cfg.AMQPConfig.Dial = func(network, addr string) (net.Conn, error) {
		dials.Add(1)
		return net.DialTimeout(network, addr, 5*time.Second)
	}
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.CorrelationID == "poison" {
			return errors.New("poison")
		}
		return recordHandler("a")(ctx, tx, m)
	}
	r := startConsumer(t, cfg, "a", pool, h)
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("poison", 1)
	pub.publish("k", 1)
	waitHandled(t, pool, map[string]int64{"k": 1})
	testkit.WaitFor(t, 30*time.Second, "dead letter", func() bool { return queueDepth(t, r.c.Topology().DeadQueue()) == 1 })
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials through AMQPConfig.Dial, want 2 (consumers, dead letters)", n)
	}
}
