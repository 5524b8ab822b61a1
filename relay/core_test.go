package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/relayhook"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// The tests in this file drive the relay's state machine on the in-memory
// fakes of relaytest: no servers, milliseconds each. The behaviours they
// cover are also tested against the real servers elsewhere in the package.

// core is one relay on fakes: node "n1" holding partitions 0..3.
type core struct {
	t     *testing.T
	table *relaytest.LeaseTable
	own   *relaytest.Ownership
	store *relaytest.Store
	pub   *relaytest.Publisher
	r     *relay.Relay
	cfg   relay.Config // r's
	logs  *syncBuffer
	// perKeyLimit, when above 1, is the per-key limit start runs the relay
	// with (internal/relayhook); tests set it to show what breaks.
	perKeyLimit int

	cancel context.CancelFunc
	done   chan error
}

// syncBuffer is a bytes.Buffer safe for the relay's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const coreParts = 4

func newCore(t *testing.T, ttl time.Duration, edit func(*relay.Config)) *core {
	t.Helper()
	c := &core{t: t, table: relaytest.NewLeaseTable(), pub: relaytest.NewPublisher(), logs: &syncBuffer{}}
	c.own = c.table.Ownership("n1", ttl)
	c.store = relaytest.NewStore(c.table)
	for p := range coreParts {
		c.table.Grant("n1", p)
	}
	cfg := relay.DefaultConfig()
	cfg.Node = "n1"
	cfg.PollInterval = 20 * time.Millisecond
	cfg.RetryMin, cfg.RetryMax = time.Millisecond, 5*time.Millisecond
	cfg.SettleTimeout = 200 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if edit != nil {
		edit(&cfg)
	}
	c.cfg = cfg
	c.withStore(c.store.ForNode(cfg.Node))
	return c
}

// withStore replaces c's relay (not started yet) with one on store, a
// wrapper of c.store.ForNode(c.cfg.Node).
func (c *core) withStore(store relay.Store) {
	c.t.Helper()
	r, err := relay.New(c.cfg, store, c.pub, c.own)
	if err != nil {
		c.t.Fatal(err)
	}
	c.r = r
}

// start runs the relay until the test ends.
func (c *core) start() {
	ctx, cancel := context.WithCancel(relayhook.WithPerKeyLimit(context.Background(), c.perKeyLimit))
	c.cancel, c.done = cancel, make(chan error, 1)
	go func() { c.done <- c.r.Run(ctx) }()
	c.t.Cleanup(c.stop)
}

func (c *core) stop() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	select {
	case err := <-c.done:
		if err != nil {
			c.t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		c.t.Error("Run did not return within 10s of its context ending")
	}
}

// insert adds rows keys×perKey rows spread over the partitions, one key at
// a time in turn, and returns the ids.
func (c *core) insert(keys, perKey int) []uuid.UUID {
	var ids []uuid.UUID
	for range perKey {
		for k := range keys {
			ids = append(ids, c.store.Insert(k%coreParts, fmt.Sprintf("key-%d", k))...)
		}
	}
	return ids
}

// waitTimeout bounds every wait of the tests on fakes (testkit.WaitFor).
const waitTimeout = 10 * time.Second

func (c *core) waitDrained() {
	c.t.Helper()
	testkit.WaitFor(c.t, waitTimeout, "every row marked", func() bool { return c.store.Pending() == 0 })
	if err := relaytest.CheckOrder(c.pub.Delivered()); err != nil {
		c.t.Fatal(err)
	}
}

// failFirst fails the first attempt of about one message in every n with
// outcome.
func failFirst(n int, outcome relay.Outcome) func(*relay.Message) (relay.Result, bool) {
	var mu sync.Mutex
	seen := map[uuid.UUID]bool{}
	count := 0
	return func(m *relay.Message) (relay.Result, bool) {
		mu.Lock()
		defer mu.Unlock()
		if seen[m.ID] {
			return relay.Result{}, false
		}
		seen[m.ID] = true
		count++
		if count%n != 0 {
			return relay.Result{}, false
		}
		return relay.Result{Outcome: outcome, Err: errors.New("injected " + outcome.String())}, true
	}
}

func TestCoreDeliversEveryKeyInOrder(t *testing.T) {
	for _, outcome := range []relay.Outcome{relay.Nacked, relay.Returned, relay.Failed, relay.Unsent} {
		t.Run(outcome.String(), func(t *testing.T) {
			c := newCore(t, 0, nil)
			c.pub.SetFault(failFirst(7, outcome))
			c.insert(40, 6)
			c.start()
			c.waitDrained()
			// The store has the marks a moment before the stats do.
			testkit.WaitFor(t, waitTimeout, "240 marked", func() bool { return c.r.Stats().Marked == 240 })
			st := c.r.Stats()
			if outcome == relay.Unsent && st.Failed != 0 {
				t.Fatalf("unsent publishes counted %d failed attempts, want 0", st.Failed)
			}
			if outcome != relay.Unsent && st.Failed == 0 {
				t.Fatal("no failed attempt recorded")
			}
		})
	}
}

// TestCorePerKeyRuleIsWhatKeepsOrder: with injected nacks, a per-key limit
// of 2 lets a key's next message overtake a failed one, and CheckOrder
// sees it; with the limit at 1 it cannot happen.
func TestCorePerKeyRuleIsWhatKeepsOrder(t *testing.T) {
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			c := newCore(t, 0, nil)
			c.perKeyLimit = limit
			c.pub.SetFaultDelay(time.Millisecond) // nacks come later, as from a broker
			t.Cleanup(c.pub.Quiesce)
			c.pub.SetFault(func(m *relay.Message) (relay.Result, bool) {
				if m.KeySeq == 1 {
					if row, _ := c.store.Get(m.ID); row.Attempts == 0 {
						return relay.Result{Outcome: relay.Nacked, Err: errors.New("injected nack")}, true
					}
				}
				return relay.Result{}, false
			})
			c.insert(20, 3)
			c.start()
			testkit.WaitFor(t, waitTimeout, "every row marked", func() bool { return c.store.Pending() == 0 })
			err := relaytest.CheckOrder(c.pub.Delivered())
			if limit == 1 && err != nil {
				t.Fatal(err)
			}
			if limit == 2 && err == nil {
				t.Fatal("a per-key limit of 2 kept order: the check cannot catch a broken rule")
			}
		})
	}
}

// probe inserts one row of a new key and waits until it is published: the
// relay has read and dispatched since, so anything it would have
// published by then, it has.
func (c *core) probe(partition int, held bool) {
	c.t.Helper()
	id := c.store.Insert(partition, "probe-"+uuid.NewString())[0]
	testkit.WaitFor(c.t, waitTimeout, "the probe published", func() bool {
		for _, m := range c.pub.Sent() {
			if m.ID == id {
				return true
			}
		}
		return false
	})
	if held {
		c.pub.Release(0, relay.Result{})
	}
}

func TestCoreOneUnconfirmedPerKeyAndWindow(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.Window = 7 })
	c.pub.Hold(true)
	c.insert(3, 10) // 3 keys: at most 3 in flight
	c.start()
	testkit.WaitFor(t, waitTimeout, "3 held", func() bool { now, _ := c.pub.Held(); return now == 3 })
	c.probe(1, true)
	if now, most := c.pub.Held(); now != 4 || most != 4 {
		t.Fatalf("held %d (most %d), want 4: one per key", now, most)
	}
	keys := map[string]bool{}
	for _, m := range c.pub.HeldMessages() {
		if keys[m.CorrelationID] {
			t.Fatalf("key %s has two messages unconfirmed", m.CorrelationID)
		}
		keys[m.CorrelationID] = true
	}
	// Many keys: the window bounds what is published and not yet marked.
	for k := range 50 {
		c.store.Insert(k%coreParts, fmt.Sprintf("wide-%d", k))
	}
	testkit.WaitFor(t, waitTimeout, "window full", func() bool { now, _ := c.pub.Held(); return now == 7 })
	for range 20 {
		c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
		if _, most := c.pub.Held(); most > 7 {
			t.Fatalf("%d unconfirmed at once, window 7", most)
		}
		if st := c.r.Stats(); st.InFlight > 7 {
			t.Fatalf("%d published and unmarked at once, window 7", st.InFlight)
		}
		time.Sleep(time.Millisecond)
	}
	c.pub.Hold(false)
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	c.waitDrained()
}

func TestCoreConfirmsOutOfOrderKeepKeyOrder(t *testing.T) {
	c := newCore(t, 0, nil)
	c.pub.Hold(true)
	c.insert(30, 4)
	c.start()
	for c.store.Pending() > 0 {
		testkit.WaitFor(t, waitTimeout, "held", func() bool { now, _ := c.pub.Held(); return now > 0 || c.store.Pending() == 0 })
		c.pub.ReleaseReversed(relay.Result{Outcome: relay.Confirmed})
	}
	c.waitDrained()
}

func TestCoreParksAfterMaxAttemptsAndOnlyItsKeyWaits(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.MaxAttempts = 3 })
	c.pub.SetFault(func(m *relay.Message) (relay.Result, bool) {
		if m.CorrelationID == "poison" {
			return relay.Result{Outcome: relay.Returned, Err: errors.New("unroutable")}, true
		}
		return relay.Result{}, false
	})
	poison := c.store.Insert(1, "poison", "poison")
	others := c.insert(12, 3)
	c.start()
	testkit.WaitFor(t, waitTimeout, "poison parked", func() bool { r, _ := c.store.Get(poison[0]); return r.Parked })
	testkit.WaitFor(t, waitTimeout, "other keys marked", func() bool {
		for _, id := range others {
			if r, _ := c.store.Get(id); !r.Processed {
				return false
			}
		}
		return true
	})
	head, _ := c.store.Get(poison[0])
	follower, _ := c.store.Get(poison[1])
	if head.Attempts != 3 || follower.Processed || follower.Attempts != 0 {
		t.Fatalf("head attempts %d (want 3); follower processed %v attempts %d (want pending, untried)",
			head.Attempts, follower.Processed, follower.Attempts)
	}
	for _, m := range c.pub.Sent() {
		if m.ID == poison[1] {
			t.Fatal("the parked key's follower was published")
		}
	}
	if st := c.r.Stats(); st.Parked != 1 {
		t.Fatalf("stats parked %d, want 1", st.Parked)
	}
}

func TestCoreUnsentIsRetriedWithoutAnAttempt(t *testing.T) {
	c := newCore(t, 0, nil)
	c.pub.Hold(true)
	ids := c.insert(5, 1)
	c.start()
	testkit.WaitFor(t, waitTimeout, "5 held", func() bool { now, _ := c.pub.Held(); return now == 5 })
	c.pub.Close(false)
	testkit.WaitFor(t, waitTimeout, "republished", func() bool { now, _ := c.pub.Held(); return now == 5 })
	c.pub.Hold(false)
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	c.waitDrained()
	for _, id := range ids {
		if r, _ := c.store.Get(id); r.Attempts != 0 {
			t.Fatalf("row %s: %d attempts after an unsent publish, want 0", id, r.Attempts)
		}
	}
	if st := c.r.Stats(); st.Unsent != 5 {
		t.Fatalf("unsent %d, want 5", st.Unsent)
	}
}

func TestCoreNoReadsWhileDisconnected(t *testing.T) {
	c := newCore(t, 0, nil)
	c.pub.Close(true)
	c.insert(4, 2)
	c.start()
	time.Sleep(100 * time.Millisecond) // five poll intervals: nothing may happen
	if n := c.store.Reads(); n != 0 {
		t.Fatalf("%d reads while the broker was away", n)
	}
	c.pub.Reconnect()
	c.waitDrained()
}

// TestCoreMarkRefusedAtStaleEpoch: a node whose partition was claimed by
// another while its publish was unconfirmed has its mark refused; the row
// stays pending for the new owner.
func TestCoreMarkRefusedAtStaleEpoch(t *testing.T) {
	c := newCore(t, 0, nil)
	c.pub.Hold(true)
	ids := c.store.Insert(2, "k")
	c.start()
	testkit.WaitFor(t, waitTimeout, "held", func() bool { now, _ := c.pub.Held(); return now == 1 })
	c.table.Steal("n2", 2)
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	testkit.WaitFor(t, waitTimeout, "mark refused", func() bool { return c.r.Stats().Refused == 1 })
	if r, _ := c.store.Get(ids[0]); r.Processed {
		t.Fatal("a mark at a stale epoch was accepted")
	}
}

// TestCoreHandoffWaitsForFlights: a revoked partition publishes nothing
// more, and its Revoked is acknowledged only once the messages it had in
// flight are confirmed and marked.
func TestCoreHandoffWaitsForFlights(t *testing.T) {
	c := newCore(t, 0, nil)
	c.pub.Hold(true)
	ids := c.store.Insert(3, "a", "b")
	c.start()
	testkit.WaitFor(t, waitTimeout, "2 held", func() bool { now, _ := c.pub.Held(); return now == 2 })
	acked := c.own.Revoke(3)
	testkit.WaitFor(t, waitTimeout, "revoke applied", func() bool { return c.r.Stats().Revoked == 1 })
	c.store.Insert(3, "a", "c")
	c.probe(0, true)
	if len(c.pub.Sent()) != 3 {
		t.Fatalf("%d publishes of partition 3 after it was revoked", len(c.pub.Sent())-3)
	}
	select {
	case <-acked:
		t.Fatal("revoke acknowledged with two publishes of the partition unconfirmed")
	default:
	}
	if st := c.r.Stats(); st.Revoking != 1 {
		t.Fatalf("Revoking = %d with the flights unsettled, want 1", st.Revoking)
	}
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	waitClosed(t, "revoke acknowledged", acked)
	for _, id := range ids {
		if r, _ := c.store.Get(id); !r.Processed {
			t.Fatalf("revoke acknowledged before row %s was marked", id)
		}
	}
	if st := c.r.Stats(); st.Revoking != 0 {
		t.Fatalf("Revoking = %d after the acknowledgement", st.Revoking)
	}
}

// TestCoreHandoffAcksFailuresAndUnsent: flights that end without a mark
// (a nack recorded as a failure, a publish found unsent) end the wait too,
// and a partition with nothing in flight is acknowledged at once.
func TestCoreHandoffAcksFailuresAndUnsent(t *testing.T) {
	c := newCore(t, 0, nil)
	c.pub.Hold(true)
	nacked := c.store.Insert(1, "n")
	c.store.Insert(2, "u")
	c.start()
	testkit.WaitFor(t, waitTimeout, "2 held", func() bool { now, _ := c.pub.Held(); return now == 2 })
	idle := c.own.Revoke(0)
	waitClosed(t, "revoke of an idle partition acknowledged", idle)
	one, two := c.own.Revoke(1), c.own.Revoke(2)
	testkit.WaitFor(t, waitTimeout, "revokes applied", func() bool { return c.r.Stats().Revoked == 3 })
	for _, m := range c.pub.HeldMessages() {
		res := relay.Result{Outcome: relay.Unsent}
		if m.ID == nacked[0] {
			res = relay.Result{Outcome: relay.Nacked, Err: errors.New("injected nack")}
		}
		c.pub.ReleaseID(m.ID, res)
	}
	waitClosed(t, "revoke of the nacked partition acknowledged", one)
	waitClosed(t, "revoke of the unsent partition acknowledged", two)
	if r, _ := c.store.Get(nacked[0]); r.Attempts != 1 {
		t.Fatalf("acknowledged with the nack not recorded (attempts %d)", r.Attempts)
	}
}

// waitClosed waits until ch is closed, failing the test after 10 s.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestCorePrevKeySeqStepsOverDeadRows(t *testing.T) {
	c := newCore(t, 0, nil)
	ids := c.store.Insert(0, "k", "k", "k", "k")
	c.store.Update(ids[0], func(r *relaytest.StoredRow) { r.Processed = true })
	for _, id := range ids[1:3] {
		c.store.Update(id, func(r *relaytest.StoredRow) { r.Processed, r.Dead = true, true })
	}
	c.start()
	testkit.WaitFor(t, waitTimeout, "marked", func() bool { return c.store.Pending() == 0 })
	d := c.pub.Delivered()
	if len(d) != 1 || d[0].KeySeq != 4 || d[0].PrevKeySeq != 1 {
		t.Fatalf("delivered %+v, want key_seq 4 with prev 1", d)
	}
}

func TestCoreUnpublishableRowIsParked(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.MaxAttempts = 2 })
	ids := c.store.Insert(0, "bad", "bad")
	c.store.Update(ids[0], func(r *relaytest.StoredRow) { r.Headers = []byte(`{"x": {"nested": 1}}`) })
	good := c.store.Insert(1, "good")
	c.start()
	testkit.WaitFor(t, waitTimeout, "bad row parked", func() bool { r, _ := c.store.Get(ids[0]); return r.Parked })
	testkit.WaitFor(t, waitTimeout, "good row marked", func() bool { r, _ := c.store.Get(good[0]); return r.Processed })
	if r, _ := c.store.Get(ids[0]); !strings.Contains(r.LastError, "unpublishable") {
		t.Fatalf("last error %q", r.LastError)
	}
}

// TestCoreSlowReadLosesNothing: a read slower than the lease's remaining
// validity, while renewals keep the lease, publishes what it read: a
// row checked against a lease snapshot from before the read would be
// skipped, and read again at once, forever.
func TestCoreSlowReadLosesNothing(t *testing.T) {
	const ttl = 150 * time.Millisecond
	c := newCore(t, ttl, nil)
	renewing, stopRenew := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for renewing.Err() == nil {
			c.own.Renew()
			time.Sleep(ttl / 5)
		}
	}()
	t.Cleanup(func() { stopRenew(); wg.Wait() })
	c.store.SetReadDelay(2 * ttl)
	c.insert(20, 2)
	c.start()
	c.waitDrained()
	if st := c.r.Stats(); st.LeaseSkipped != 0 {
		t.Fatalf("%d rows skipped for the lease although it was renewed throughout", st.LeaseSkipped)
	}
}

// TestCoreLeaseLostDuringReadIsCounted: rows whose lease changed hands
// during the read are not published, and the skip is counted and logged.
func TestCoreLeaseLostDuringReadIsCounted(t *testing.T) {
	c := newCore(t, 0, nil)
	c.store.SetReadDelay(100 * time.Millisecond)
	c.store.Insert(0, "a", "b", "c")
	c.start()
	time.Sleep(20 * time.Millisecond) // inside the first read
	c.table.Grant("n2", 0)
	testkit.WaitFor(t, waitTimeout, "lease skips counted", func() bool { return c.r.Stats().LeaseSkipped == 3 })
	if n := len(c.pub.Sent()); n != 0 {
		t.Fatalf("%d rows published after their lease changed hands", n)
	}
	testkit.WaitFor(t, waitTimeout, "lease skip logged", func() bool { return strings.Contains(c.logs.String(), "lease lapsed or changed hands") })
}

// TestCoreStallIsLoud: reads that keep failing (a plan too slow for the
// read timeout) show as StalledSeconds and in the log, and the recovery is
// logged too.
func TestCoreStallIsLoud(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.ReadTimeout = 30 * time.Millisecond })
	c.store.SetReadDelay(time.Second)
	c.insert(3, 1)
	c.start()
	testkit.WaitFor(t, waitTimeout, "stall logged", func() bool { return strings.Contains(c.logs.String(), "outbox publishing unavailable") })
	if st := c.r.Stats(); st.StalledSeconds < 2 || st.Published != 0 || st.SlowRows != 0 {
		t.Fatalf("stalled %.1fs (want >= 2) with %d published, %d rows charged for slow reads (want 0: the database is slow, not a row)",
			st.StalledSeconds, st.Published, st.SlowRows)
	}
	if !strings.Contains(c.logs.String(), "took longer than 30ms") {
		t.Fatalf("the read timeout is not named in the log:\n%s", c.logs.String())
	}
	c.store.SetReadDelay(0)
	c.waitDrained()
	testkit.WaitFor(t, waitTimeout, "recovery logged", func() bool { return strings.Contains(c.logs.String(), "outbox publishing available again") })
	if st := c.r.Stats(); st.StalledSeconds != 0 {
		t.Fatalf("still stalled %.1fs after draining", st.StalledSeconds)
	}
}

// TestCoreLapsedLeaseIsAStall: rows ready to go while the partition's
// lease has lapsed (renewals failing) are a stall: counted, shown and
// logged; when the lease is renewed they go.
func TestCoreLapsedLeaseIsAStall(t *testing.T) {
	c := newCore(t, time.Hour, nil)
	c.pub.Hold(true)
	c.store.Insert(2, "a", "a", "b", "b")
	c.start()
	testkit.WaitFor(t, waitTimeout, "2 held", func() bool { now, _ := c.pub.Held(); return now == 2 })
	c.own.Expire()
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	testkit.WaitFor(t, waitTimeout, "stall logged", func() bool { return strings.Contains(c.logs.String(), "outbox publishing unavailable") })
	if st := c.r.Stats(); st.LeaseSkipped == 0 || st.IdleReads == 0 || st.StalledSeconds < 2 {
		t.Fatalf("stats during the stall: %+v", st)
	}
	c.pub.Hold(false)
	c.own.Renew()
	c.waitDrained()
	testkit.WaitFor(t, waitTimeout, "recovery logged", func() bool { return strings.Contains(c.logs.String(), "outbox publishing available again") })
}

// TestCoreBlockedPublisherStopsCleanly: a publish blocked by the broker
// (a resource alarm) does not keep Run from returning.
func TestCoreBlockedPublisherStopsCleanly(t *testing.T) {
	c := newCore(t, 0, nil)
	c.insert(2, 1)
	c.pub.Block()
	c.start()
	time.Sleep(50 * time.Millisecond)
	if n := len(c.pub.Sent()); n != 0 {
		t.Fatalf("%d sent while blocked", n)
	}
	c.stop()
}

// TestCoreRetryAfterBackoffDoesNotWaitForThePoll: a key whose backoff ends
// goes at once, not at the next poll.
func TestCoreRetryAfterBackoffDoesNotWaitForThePoll(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.PollInterval = 5 * time.Second })
	c.pub.SetFault(failFirst(1, relay.Nacked))
	c.store.Insert(0, "k")
	start := time.Now()
	c.start()
	c.waitDrained()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a nacked message with a few ms of backoff was delivered after %v (poll 5s)", took)
	}
}

// TestCoreDeadRowLookupFailureBacksOff: when the lookup of a dead row's
// predecessor fails (database down), the relay backs off instead of
// spinning on it, and goes on once it works.
func TestCoreDeadRowLookupFailureBacksOff(t *testing.T) {
	c := newCore(t, 0, nil)
	ids := c.store.Insert(0, "k", "k")
	c.store.Update(ids[0], func(r *relaytest.StoredRow) { r.Processed, r.Dead = true, true })
	c.store.FailPrevKeySeq(errors.New("injected: database down"))
	c.start()
	time.Sleep(300 * time.Millisecond)
	if n := c.store.PrevKeySeqCalls(); n > 50 {
		t.Fatalf("%d lookups in 300ms: the relay spins on a failing lookup", n)
	}
	c.store.FailPrevKeySeq(nil)
	c.waitDrained()
}
