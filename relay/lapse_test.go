package relay_test

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// The local lease deadline, checked before every publish (docs/design.md,
// invariant 3): a node whose lease has lapsed and been claimed elsewhere
// sends nothing more, although it still believes it holds the partition
// at the same epoch and has rows ready in memory. The relay checks it
// before handing a row to the publisher (and again after the dead-row
// lookup), and hands the deadline on, which the publisher keeps to
// (deadline_test.go, relay/rabbitmq).

// TestCoreNothingSentAfterLapseAndClaim: every key's first message is
// unconfirmed when the node's renewals stop (its local deadline passes)
// and another node claims its partitions (its own view does not change:
// the claim is in the database only). Then the broker confirms the first
// messages, so every key's second message is due. Nothing more is sent.
func TestCoreNothingSentAfterLapseAndClaim(t *testing.T) {
	c := newCore(t, time.Hour, nil)
	c.pub.Hold(true)
	const keys = 8
	c.insert(keys, 3)
	c.start()
	testkit.WaitFor(t, waitTimeout, "every key's first message held", func() bool { now, _ := c.pub.Held(); return now == keys })
	c.own.Expire()
	c.table.Steal("n2", 0, 1, 2, 3)
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	testkit.WaitFor(t, waitTimeout, "every key's next message refused for its lease, three times over, or sent", func() bool {
		return c.r.Stats().LeaseSkipped >= 3*keys || len(c.pub.Sent()) > keys
	})
	if sent := c.pub.Sent(); len(sent) != keys {
		t.Fatalf("%d messages sent after the lease lapsed and was claimed elsewhere (first: key %s key_seq %d)",
			len(sent)-keys, sent[keys].CorrelationID, sent[keys].KeySeq)
	}
	if st := c.r.Stats(); st.Refused != keys || st.Marked != 0 {
		t.Fatalf("marks after the claim: %d refused, %d marked; want %d refused", st.Refused, st.Marked, keys)
	}
}

// blockingPrev makes the dead-row lookup wait until the test lets it go.
type blockingPrev struct {
	relay.Store
	entered chan struct{} // signalled (without blocking) on each call
	proceed chan struct{} // closed by the test
}

func (b *blockingPrev) PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	select {
	case <-b.proceed:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return b.Store.PrevKeySeq(ctx, key, keySeq)
}

// TestCoreLeaseCheckedAgainAfterDeadRowLookup: a row whose predecessor was
// skipped needs a database lookup between the lease check and the publish.
// The lease lapses and is claimed elsewhere during that lookup: the row is
// not sent ("a check followed by a wait is not a check").
func TestCoreLeaseCheckedAgainAfterDeadRowLookup(t *testing.T) {
	c := newCore(t, time.Hour, func(x *relay.Config) {
		x.ReadTimeout = 10 * time.Second // the lookup's bound: longer than the test holds it
	})
	store := &blockingPrev{Store: c.store.ForNode(c.cfg.Node), entered: make(chan struct{}, 1), proceed: make(chan struct{})}
	c.withStore(store)
	ids := c.store.Insert(0, "k", "k", "k")
	c.store.Update(ids[0], func(r *relaytest.StoredRow) { r.Processed = true })
	c.store.Update(ids[1], func(r *relaytest.StoredRow) { r.Processed, r.Dead = true, true })
	c.start()
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never looked up the dead row's predecessor")
	}
	c.own.Expire()
	c.table.Steal("n2", 0)
	close(store.proceed)
	testkit.WaitFor(t, waitTimeout, "the row refused for its lease, or sent", func() bool {
		return c.r.Stats().LeaseSkipped > 0 || len(c.pub.Sent()) > 0
	})
	if sent := c.pub.Sent(); len(sent) != 0 {
		t.Fatalf("key_seq %d sent after its lease lapsed during the dead-row lookup", sent[0].KeySeq)
	}
}

// publishRecorder records every publish the publisher accepted (sent):
// its partition, epoch and the time Publish was called. It delays each
// outcome by delay, so a key's messages, which go one at a time, take long
// to drain.
type publishRecorder struct {
	relay.Publisher
	delay time.Duration

	mu   sync.Mutex
	recs []publishRecord
}

type publishRecord struct {
	partition int
	epoch     int64
	at        time.Time
}

func (p *publishRecorder) wrap(inner relay.Publisher) relay.Publisher { p.Publisher = inner; return p }

func (p *publishRecorder) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	rec := publishRecord{m.Partition, m.Epoch, time.Now()}
	err := p.Publisher.Publish(ctx, m, func(res relay.Result) {
		time.AfterFunc(p.delay, func() { settle(res) })
	})
	if err == nil {
		p.mu.Lock()
		p.recs = append(p.recs, rec)
		p.mu.Unlock()
	}
	return err
}

func (p *publishRecorder) records() []publishRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]publishRecord(nil), p.recs...)
}

// TestNothingSentAfterLeaseLapsedAndClaimed: node "lapsed" has a backlog
// of hot keys in memory (confirms slowed to 20 ms, so each key drains for
// seconds) when its leaser's database link is cut; its relay keeps its
// own link and the broker. Its renewals fail, its local deadline passes,
// and node "heir", waiting all along, claims every partition once the
// database lets the leases expire. "lapsed" sends nothing after the claim
// (by the local deadline check alone: its marks still work until then),
// "heir" delivers the rest, and nothing is lost or reordered.
func TestNothingSentAfterLeaseLapsedAndClaimed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const keys, perKey = 8, 150
	for range perKey {
		var msgs []outbox.Message
		for k := range keys {
			msgs = append(msgs, h.msg(fmt.Sprintf("hot-%d", k), "order.placed", "t.v1"))
		}
		h.expect(h.enqueue(msgs...))
	}
	proxy := testkit.NewProxy(t, hostPort(testkit.PostgresURL()))
	rec := &publishRecorder{delay: 20 * time.Millisecond}
	h.startNode(nodeOpts{name: "lapsed", leaseDBURL: proxy.URL(h.dbURL), wrapPub: rec.wrap})
	h.checker.WaitDistinct(t, 2*keys, 30*time.Second)
	h.startNode(nodeOpts{name: "heir"})

	proxy.Cut()
	cutAt := time.Now()
	claims := h.waitClaims(t, "heir")
	var first time.Time
	for _, c := range claims {
		if first.IsZero() || c.at.Before(first) {
			first = c.at
		}
	}
	t.Logf("heir claimed its first partition %v after the cut", first.Sub(cutAt).Round(time.Millisecond))
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}

	recs := rec.records()
	sort.Slice(recs, func(i, j int) bool { return recs[i].at.Before(recs[j].at) })
	for _, r := range recs {
		if c := claims[r.partition]; r.at.After(c.at) {
			t.Fatalf("lapsed sent a message on partition %d (epoch %d) %v after heir claimed it (epoch %d)",
				r.partition, r.epoch, r.at.Sub(c.at), c.epoch)
		}
	}
	last := recs[len(recs)-1].at
	t.Logf("lapsed sent %d messages, the last %v after the cut and %v before heir's first claim",
		len(recs), last.Sub(cutAt).Round(time.Millisecond), first.Sub(last).Round(time.Millisecond))
	byHeir := 0
	for _, d := range h.checker.Deliveries() {
		if d.Epoch == claims[d.Partition].epoch {
			byHeir++
		}
	}
	t.Logf("heir delivered %d messages", byHeir)
	if byHeir == 0 {
		t.Fatal("heir delivered nothing: lapsed drained its backlog before its lease lapsed, and the test proved nothing")
	}
	h.waitRows(30*time.Second, "every row marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}

// hostPort is the host:port of a server URL (testkit.PostgresURL(),
// testkit.AMQPURL()), for a proxy in front of it.
func hostPort(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err)
	}
	return u.Host
}

// claim is a lease claim as ordo_lease_audit records it.
type claim struct {
	at    time.Time
	epoch int64
}

// waitClaims waits until node holds every partition and returns, per
// partition, the claim that gave it the lease it holds.
func (h *harness) waitClaims(t *testing.T, node string) map[int]claim {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	waitCond(t, 30*time.Second, node+" holds every partition", func() bool {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM ordo_leases WHERE owner = $1`, node).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == testPartitions
	})
	rows, err := h.pool.Query(ctx, `SELECT a.partition, a.at, a.epoch FROM ordo_lease_audit AS a
		JOIN ordo_leases AS l ON l.partition = a.partition AND l.epoch = a.epoch AND l.owner = a.node
		WHERE a.node = $1 AND a.event = 'claim'`, node)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]claim{}
	for rows.Next() {
		var p int
		var c claim
		if err := rows.Scan(&p, &c.at, &c.epoch); err != nil {
			t.Fatal(err)
		}
		out[p] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) != testPartitions {
		t.Fatalf("%d claims of %s found for the leases it holds, want %d", len(out), node, testPartitions)
	}
	return out
}
