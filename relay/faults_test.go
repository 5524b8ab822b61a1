package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// TestUnroutableNotMarked: a message nothing is bound to is returned by the
// broker and stays pending with its error, while a routable message sent
// alongside is delivered and marked.
func TestUnroutableNotMarked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	bad := h.enqueue(h.msg("lonely", "nobody.home", "t.v1"))[0]
	good := h.enqueue(h.msg("fine", "order.placed", "t.v1"))
	h.expect(good)
	h.startNode(nodeOpts{})
	h.checker.WaitDistinct(t, 1, 30*time.Second)
	h.waitRows(30*time.Second, "the unroutable row failed at least twice", func(n int) bool { return n == 1 },
		"id = $1 AND attempts >= 2 AND processed_at IS NULL AND last_error LIKE '%NO_ROUTE%'", bad)
	h.waitRows(30*time.Second, "the routable row is marked", func(n int) bool { return n == 1 },
		"id = $1 AND processed_at IS NOT NULL", good[0])
	if rep := h.checker.Report(); rep.Distinct != 1 || !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

// TestMissingExchangeOtherKeysFlow: messages to an exchange that does not
// exist fail (checked by a passive declare), and every other key keeps
// flowing; the innocent rows are never charged an attempt.
func TestMissingExchangeOtherKeysFlow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	missing := testkit.UniqueName(t, "nosuch")
	var poison []uuid.UUID
	for i := range 5 {
		m := h.msg(fmt.Sprintf("poison-%d", i), "order.placed", "t.v1")
		m.Exchange = missing
		poison = append(poison, h.enqueue(m)...)
	}
	h.startNode(nodeOpts{})
	const keys = 200
	for i := range keys {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("good-%d", i), "order.placed", "t.v1")))
	}
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if rep.Distinct != keys || !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	h.waitRows(30*time.Second, "every poison row failed with exchange not found", func(n int) bool { return n == len(poison) },
		"exchange = $1 AND processed_at IS NULL AND attempts >= 1 AND last_error LIKE '%exchange not found%'", missing)
	if n := h.count("exchange <> $1 AND attempts > 0", missing); n != 0 {
		t.Fatalf("%d innocent rows were charged an attempt", n)
	}
}

// TestMissingExchangeChannelCloseIsNotAnAttempt: when a publish to an
// exchange deleted after its passive check closes the channel (404), the
// other messages in flight on it are unsent, not failed, and keep flowing.
func TestMissingExchangeChannelCloseIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	doomed := testkit.NewExchange(t)
	// Retries a second or more apart: the doomed row must still be
	// retrying (not parked after its 5 attempts) when its exchange goes,
	// however slowly this test sees its first attempt on a loaded machine.
	n := h.startNode(nodeOpts{retryMin: time.Second, retryMax: 2 * time.Second})
	m := h.msg("doomed", "order.placed", "t.v1")
	m.Exchange = doomed
	h.enqueue(m) // unbound, so it is returned and retried, its exchange checked once
	h.waitRows(30*time.Second, "the doomed row was tried", func(n int) bool { return n == 1 },
		"exchange = $1 AND attempts >= 1", doomed)
	testkit.WithChannel(t, func(ch *amqp.Channel) error { return ch.ExchangeDelete(doomed, false, false) })

	const keys = 300
	for i := range keys {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("good-%d", i), "order.placed", "t.v1")))
	}
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	h.waitRows(30*time.Second, "the doomed row fails with exchange not found", func(n int) bool { return n == 1 },
		"exchange = $1 AND last_error LIKE '%exchange not found%'", doomed)
	if got := n.brokerState(t).ChannelsOpened; got < 2 {
		t.Fatalf("channels opened = %d: the broker never closed the channel, so the test proved nothing", got)
	}
	if got := h.count("exchange <> $1 AND attempts > 0", doomed); got != 0 {
		t.Fatalf("%d innocent rows were charged an attempt", got)
	}
}

// failingMarks wraps a Store so MarkPublished fails while armed: the node
// has published and been confirmed, but cannot mark, as if it died between
// confirm and mark.
type failingMarks struct {
	relay.Store
	armed     atomic.Bool
	attempted atomic.Int64
}

func (f *failingMarks) MarkPublished(ctx context.Context, rows []relay.Settled) ([]uuid.UUID, error) {
	if f.armed.Load() {
		f.attempted.Add(int64(len(rows)))
		return nil, errors.New("injected: node died before marking")
	}
	return f.Store.MarkPublished(ctx, rows)
}

// TestCrashBetweenConfirmAndMark: rows confirmed but never marked are
// published again by the next owner, with the same message-id and key_seq.
func TestCrashBetweenConfirmAndMark(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const n = 50
	for i := range n {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("k-%d", i%10), "order.placed", "t.v1")))
	}
	fm := &failingMarks{}
	fm.armed.Store(true)
	first := h.startNode(nodeOpts{name: "crashy", wrapStore: func(s relay.Store) relay.Store { fm.Store = s; return fm }})
	// Keys have 5 rows each. Their heads go out first; a key's next row
	// may follow once the row below is confirmed in this epoch, marked or
	// not, so by the crash anything from 10 to all 50 may have arrived,
	// none of them marked.
	h.checker.WaitDistinct(t, 10, 30*time.Second)
	first.crash()
	if got := h.count("processed_at IS NOT NULL"); got != 0 {
		t.Fatalf("%d rows marked although every mark failed", got)
	}
	before := h.checker.Deliveries()

	h.startNode(nodeOpts{name: "crashy"}) // restarted under the same name
	// Every row delivered before the crash is published again: wait for
	// the first 10 of them, not only for the rest (the first node may have
	// delivered every row before it crashed).
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 && r.Duplicates >= 10 })
	if !rep.OK() || rep.Duplicates < 10 {
		t.Fatalf("want every row delivered, the first 10 twice: %s", rep.Detail())
	}
	keySeq := map[string]int64{}
	for _, d := range before {
		keySeq[d.MessageID] = d.KeySeq
	}
	epochs := map[int64]bool{}
	for _, d := range h.checker.Deliveries() {
		if ks, ok := keySeq[d.MessageID]; ok && ks != d.KeySeq {
			t.Fatalf("message %s republished with key_seq %d, first sent with %d", d.MessageID, d.KeySeq, ks)
		}
		epochs[d.Epoch] = true
	}
	if len(epochs) < 2 {
		t.Fatalf("the restarted node did not claim a new epoch: %v", epochs)
	}
	h.waitRows(30*time.Second, "all rows marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}

// TestBrokerOutageThroughProxy: with the broker cut, rows wait; when it is
// back, all are published and nothing is lost.
func TestBrokerOutageThroughProxy(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	proxy := testkit.NewProxy(t, strings.TrimSuffix(strings.TrimPrefix(testkit.AMQPURL(), "amqp://guest:guest@"), "/"))
	n := h.startNode(nodeOpts{amqpURL: proxy.URL(testkit.AMQPURL())})
	h.expect(h.enqueue(h.msg("before", "order.placed", "t.v1")))
	h.checker.WaitDistinct(t, 1, 30*time.Second)
	h.waitRows(30*time.Second, "the first row is marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")

	proxy.Cut()
	waitCond(t, 30*time.Second, "publisher notices the cut", func() bool { return !n.pub.Connected() })
	for i := range 5 {
		// Producers keep committing while the broker is away.
		h.expect(h.enqueue(h.msg(fmt.Sprintf("during-%d", i), "order.placed", "t.v1")))
	}
	if got := h.count("processed_at IS NULL"); got != 5 {
		t.Fatalf("%d pending rows during the outage, want 5", got)
	}
	restored := time.Now()
	proxy.Restore()
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("broker back: all delivered %v after restore", time.Since(restored).Round(time.Millisecond))
	if !rep.OK() || rep.Distinct != 6 {
		t.Fatalf("checker: %s", rep.Detail())
	}
	h.waitRows(30*time.Second, "all rows marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}

func waitCond(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
}

// TestPostgresOutageThroughProxy: the node loses PostgreSQL for longer than
// its lease TTL while producers keep writing (directly). It logs the outage
// once per component instead of storming, and when PostgreSQL is back it
// renews or reclaims its leases and publishes everything, in order.
func TestPostgresOutageThroughProxy(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	pgAddr := strings.TrimPrefix(strings.SplitN(strings.TrimPrefix(testkit.PostgresURL(), "postgres://"), "/", 2)[0], "postgres@")
	proxy := testkit.NewProxy(t, pgAddr)
	logs := &countingHandler{}
	h.startNode(nodeOpts{dbURL: proxy.URL(h.dbURL), logger: slog.New(logs)})
	h.placeAndCancel(20)
	h.checker.WaitDistinct(t, 40, 30*time.Second)

	proxy.Cut()
	cutAt := time.Now()
	h.placeAndCancel(50)
	waitCond(t, 30*time.Second, "the node reports the outage", func() bool { return logs.warnings() > 0 })
	// Stay down past the lease TTL (2 s), so the local deadline passes.
	for time.Since(cutAt) < 3*time.Second {
		h.placeAndCancel(1)
	}
	if got := h.checker.Report().Distinct; got > 40 {
		t.Fatalf("%d messages published with the database unreachable", got)
	}
	warnDuring := logs.warnings()
	proxy.Restore()
	restored := time.Now()
	want := h.count("true")
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 && r.Distinct == want })
	t.Logf("PostgreSQL back: %d messages delivered %v after restore; %d warnings during the outage",
		want, time.Since(restored).Round(time.Millisecond), warnDuring)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	if warnDuring > 8 {
		t.Fatalf("%d warnings during a 3 s outage: a log storm\n%s", warnDuring, logs.text())
	}
	h.waitRows(30*time.Second, "all rows marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}

// countingHandler is a slog handler that keeps every record.
type countingHandler struct {
	mu    sync.Mutex
	lines []string
	warns int
}

func (c *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (c *countingHandler) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Level >= slog.LevelWarn {
		c.warns++
	}
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	c.lines = append(c.lines, line)
	return nil
}
func (c *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *countingHandler) WithGroup(string) slog.Handler      { return c }
func (c *countingHandler) warnings() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.warns
}
func (c *countingHandler) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// stealBeforeMark hands every partition to another node (epoch + 1) right
// before the first mark, as a takeover during a pause would.
type stealBeforeMark struct {
	relay.Store
	pool  *pgxpool.Pool
	stole atomic.Bool
}

func (s *stealBeforeMark) MarkPublished(ctx context.Context, rows []relay.Settled) ([]uuid.UUID, error) {
	if s.stole.CompareAndSwap(false, true) {
		if _, err := s.pool.Exec(ctx, `UPDATE ordo_leases SET owner = 'thief', epoch = epoch + 1,
			expires_at = clock_timestamp() + interval '1 hour'`); err != nil {
			return nil, err
		}
	}
	return s.Store.MarkPublished(ctx, rows)
}

// TestStaleEpochMarkRefused: a mark under an epoch that is no longer
// current changes nothing and is recorded in the audit table.
func TestStaleEpochMarkRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 20 {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("k-%d", i), "order.placed", "t.v1")))
	}
	h.startNode(nodeOpts{name: "victim", wrapStore: func(s relay.Store) relay.Store {
		return &stealBeforeMark{Store: s, pool: h.pool}
	}})
	ctx := testkit.Context(t, 30*time.Second)
	var refused int
	waitCond(t, 30*time.Second, "refused writes audited", func() bool {
		_ = h.pool.QueryRow(ctx, `SELECT count(*) FROM ordo_lease_audit WHERE node = 'victim' AND event = 'refused-write'`).Scan(&refused)
		return refused > 0
	})
	waitCond(t, 30*time.Second, "lost leases audited", func() bool {
		var n int
		_ = h.pool.QueryRow(ctx, `SELECT count(*) FROM ordo_lease_audit WHERE node = 'victim' AND event = 'renew-failed'`).Scan(&n)
		return n == testPartitions
	})
	if n := h.count("processed_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows marked under a stale epoch", n)
	}
}

// TestConfirmTimeoutIsAFailure: a broker that stops answering on an open
// connection (the proxy holds every byte back) leaves publishes without a
// confirm; past the confirm timeout each is a failed attempt for its key.
// When the network answers again everything is delivered.
func TestConfirmTimeoutIsAFailure(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	proxy := testkit.NewProxy(t, strings.TrimSuffix(strings.TrimPrefix(testkit.AMQPURL(), "amqp://guest:guest@"), "/"))
	h.startNode(nodeOpts{amqpURL: proxy.URL(testkit.AMQPURL()), confirmTimeout: 300 * time.Millisecond})
	h.expect(h.enqueue(h.msg("warmup", "order.placed", "t.v1")))
	h.checker.WaitDistinct(t, 1, 30*time.Second)

	proxy.Stall()
	ids := h.enqueue(h.msg("stalled", "order.placed", "t.v1"))
	h.expect(ids)
	h.waitRows(30*time.Second, "the unconfirmed publish counted as a failed attempt", func(n int) bool { return n == 1 },
		"id = $1 AND attempts >= 1 AND processed_at IS NULL AND last_error LIKE '%no publisher confirm%'", ids[0])
	proxy.Resume()
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	h.waitRows(30*time.Second, "all rows marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}
