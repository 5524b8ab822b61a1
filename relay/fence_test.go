package relay_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// gate holds every publish, unsent and unsettled, until the test says what
// becomes of it: sent for real, settled with an outcome, or (once opened)
// passed straight through.
type gate struct {
	inner relay.Publisher // set before the node starts

	sendMu sync.Mutex // the inner publisher takes one Publish at a time
	mu     sync.Mutex
	held   []heldPublish
	open   bool // publishes go straight through
	closed bool // publishes are refused: not connected
}

type heldPublish struct {
	m      *relay.Message
	settle func(relay.Result)
}

var errGateClosed = errors.New("gate closed")

func (g *gate) wrap(p relay.Publisher) relay.Publisher { g.inner = p; return g }

func (g *gate) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	g.mu.Lock()
	switch {
	case g.closed:
		g.mu.Unlock()
		return relay.ErrNotConnected
	case !g.open:
		g.held = append(g.held, heldPublish{m, settle})
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	return g.inner.Publish(ctx, m, settle)
}

func (g *gate) Connected() bool {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	return !closed && g.inner.Connected()
}

// count returns how many held publishes have a key starting with prefix.
func (g *gate) count(prefix string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, h := range g.held {
		if strings.HasPrefix(h.m.CorrelationID, prefix) {
			n++
		}
	}
	return n
}

// take removes and returns the held publishes whose key starts with
// prefix.
func (g *gate) take(prefix string) []heldPublish {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out, keep []heldPublish
	for _, h := range g.held {
		if strings.HasPrefix(h.m.CorrelationID, prefix) {
			out = append(out, h)
		} else {
			keep = append(keep, h)
		}
	}
	g.held = keep
	return out
}

// send publishes the held messages whose key starts with prefix for real;
// the broker's answer settles them. The hold stands for the time they were
// in flight, so they go without their lease deadline: as if they had been
// written when the relay handed them over.
func (g *gate) send(prefix string) {
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	for _, h := range g.take(prefix) {
		m := *h.m
		m.Deadline = time.Time{}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := g.inner.Publish(ctx, &m, h.settle); err != nil {
			h.settle(relay.Result{Outcome: relay.Unsent, Err: err})
		}
		cancel()
	}
}

// settle settles the held messages whose key starts with prefix with res,
// without sending them.
func (g *gate) settle(prefix string, res relay.Result) {
	for _, h := range g.take(prefix) {
		h.settle(res)
	}
}

// openUp sends everything held and passes every later publish through.
func (g *gate) openUp() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
	g.send("")
}

// close settles everything held as unsent and refuses every later
// publish, as a publisher without a connection does, so a node stopping
// does not wait for confirms that will never come.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.settle("", relay.Result{Outcome: relay.Unsent, Err: errGateClosed})
}

// frozenView is a node's view of its leases that stops changing once
// frozen: it keeps offering the leases it had then, valid for an hour,
// whatever the database says since, and passes on no more of the
// leaser's events (the lease losses), as a node that has not yet noticed
// that another process took them over.
type frozenView struct {
	relay.Ownership
	t      *testing.T
	events chan relay.Event
	mu     sync.Mutex
	frozen map[int]relay.Lease
}

// wrap makes v the relay's view of o. Until frozen it passes o's events
// on, by a goroutine that stops when the test ends (after the node, whose
// cleanup is registered later).
func (v *frozenView) wrap(o relay.Ownership) relay.Ownership {
	v.Ownership, v.events = o, make(chan relay.Event)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var ev relay.Event
			select {
			case <-ctx.Done():
				return
			case ev = <-o.Events():
			}
			v.mu.Lock()
			frozen := v.frozen != nil
			v.mu.Unlock()
			if frozen {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case v.events <- ev:
			}
		}
	}()
	v.t.Cleanup(func() { cancel(); wg.Wait() })
	return v
}

func (v *frozenView) Events() <-chan relay.Event { return v.events }

// freeze fixes the view and returns the leases it keeps.
func (v *frozenView) freeze() map[int]relay.Lease {
	m := v.Ownership.(*lease.Leaser).Leases()
	for p, l := range m {
		l.Deadline = time.Now().Add(time.Hour)
		m[p] = l
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.frozen = m
	return m
}

func (v *frozenView) Lease(p int) (relay.Lease, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.frozen == nil {
		return v.Ownership.Lease(p)
	}
	l, ok := v.frozen[p]
	return l, ok
}

// refusedRows sums, per kind of write ("mark", "failure record"), the rows
// ordo_lease_audit says node's writes had refused, and fails t if any was
// at an epoch other than the one want gives for its partition.
func (h *harness) refusedRows(t *testing.T, node string, want map[int]relay.Lease) map[string]int {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	rows, err := h.pool.Query(ctx, `SELECT partition, epoch, detail FROM ordo_lease_audit
		WHERE node = $1 AND event = 'refused-write'`, node)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	detail := regexp.MustCompile(`^(.*) of (\d+) row\(s\) with a stale epoch$`)
	sums := map[string]int{}
	for rows.Next() {
		var p int
		var epoch int64
		var d string
		if err := rows.Scan(&p, &epoch, &d); err != nil {
			t.Fatal(err)
		}
		if epoch != want[p].Epoch {
			t.Fatalf("a write refused on partition %d at epoch %d; the old process held epoch %d", p, epoch, want[p].Epoch)
		}
		m := detail.FindStringSubmatch(d)
		if m == nil {
			t.Fatalf("refused write with detail %q", d)
		}
		n, _ := strconv.Atoi(m[2])
		sums[m[1]] += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return sums
}

// TestEpochFenceAloneRefusesSameName: a second live process with the same
// node name claims every partition at a newer epoch (a claim takes the
// name's own leases at once). The first one, which has not noticed (its
// view of the leases is frozen, valid), then marks rows the broker
// confirmed, records nacks, and runs retention: every one of those writes
// names the lease's current owner, so only the epoch check refuses them.
// (TestStaleEpochMarkRefused changes owner and epoch together, so the owner
// check alone passes it.)
func TestEpochFenceAloneRefusesSameName(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const keys = 8
	var markIDs, failIDs []uuid.UUID
	for i := range keys {
		markIDs = append(markIDs, h.enqueue(h.msg(fmt.Sprintf("mark-%d", i), "order.placed", "t.v1"))...)
		failIDs = append(failIDs, h.enqueue(h.msg(fmt.Sprintf("fail-%d", i), "order.placed", "t.v1"))...)
	}
	h.expect(markIDs)
	h.expect(failIDs)

	oldPub, newPub := &gate{}, &gate{}
	view := &frozenView{t: t}
	oldStore := &countingStore{}
	old := h.startNode(nodeOpts{name: "twin", wrapPub: oldPub.wrap, wrapOwn: view.wrap, retention: 30 * time.Minute,
		wrapStore: func(s relay.Store) relay.Store { oldStore.Store = s; return oldStore }})
	t.Cleanup(oldPub.close) // before the node stops (cleanups run last first)
	waitCond(t, 30*time.Second, "the first process holds every first publish", func() bool { return oldPub.count("") == 2*keys })
	leases := view.freeze()
	if len(leases) != testPartitions {
		t.Fatalf("the first process holds %d partitions, want %d", len(leases), testPartitions)
	}

	h.startNode(nodeOpts{name: "twin", wrapPub: newPub.wrap})
	t.Cleanup(newPub.close)
	ctx := testkit.Context(t, 60*time.Second)
	waitCond(t, 30*time.Second, "the second process holds every partition at a newer epoch", func() bool {
		newer := 0
		rows, err := h.pool.Query(ctx, `SELECT partition, epoch FROM ordo_leases WHERE owner = 'twin'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var p int
			var e int64
			if rows.Scan(&p, &e) == nil && e > leases[p].Epoch {
				newer++
			}
		}
		rows.Close()
		return newer == testPartitions
	})

	// Marks: the broker confirms what the first process sent.
	oldPub.send("mark-")
	waitCond(t, 30*time.Second, "the first process's mark returned", func() bool { return old.relay.Stats().Confirmed == keys })
	if st := old.relay.Stats(); st.Refused != keys || st.Marked != 0 {
		t.Fatalf("the first process's marks: %d refused and %d marked of %d", st.Refused, st.Marked, keys)
	}
	if n := h.count("id = ANY($1) AND processed_at IS NULL", markIDs); n != keys {
		t.Fatalf("%d of %d rows marked under the old epoch", keys-n, keys)
	}

	// Failure records: the first process's publishes are nacked.
	oldPub.settle("fail-", relay.Result{Outcome: relay.Nacked, Err: errors.New("injected nack")})
	waitCond(t, 30*time.Second, "the first process's failure records returned", func() bool { return old.relay.Stats().Failed == keys })
	if n := h.count("id = ANY($1) AND attempts = 0 AND last_error IS NULL", failIDs); n != keys {
		t.Fatalf("%d of %d failures recorded under the old epoch", keys-n, keys)
	}
	if got := h.refusedRows(t, "twin", leases); got["mark"] != keys || got["failure record"] != keys || len(got) != 2 {
		t.Fatalf("refused writes audited: %v, want %d marks and %d failure records", got, keys, keys)
	}

	// Retention: rows processed an hour ago, in every partition.
	var doomed []uuid.UUID
	for p := range testPartitions {
		key := ""
		for i := 0; key == "" || partition.Of(key, testPartitions) != p; i++ {
			key = fmt.Sprintf("done-%d", i)
		}
		id := uuid.Must(uuid.NewV7())
		if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, processed_at)
			VALUES ($1, $2, $3, $4, 'order.done', 't.v1', '{}', clock_timestamp() - interval '1 hour')`, id, p, key, h.exchange); err != nil {
			t.Fatal(err)
		}
		doomed = append(doomed, id)
	}
	calls := oldStore.calls()
	waitCond(t, 30*time.Second, "two retention passes of the first process", func() bool { return oldStore.calls() >= calls+2*testPartitions })
	if n := h.count("id = ANY($1)", doomed); n != testPartitions {
		t.Fatalf("retention under the old epoch deleted %d of %d rows", testPartitions-n, testPartitions)
	}

	// The second process, alone, delivers everything.
	oldPub.close()
	old.stop()
	newPub.openUp()
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	h.waitRows(30*time.Second, "every row marked by the second process", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}
