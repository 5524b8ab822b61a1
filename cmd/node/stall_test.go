package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
)

// Burst sizes of the idle-then-burst tests: the shape that once stalled
// every node for good.
const (
	burstRows = 40000
	burstKeys = 10000
)

// defaultTimings undoes the fixture's short poll interval: these tests run
// with the node's default poll and lease settings, as users do.
var defaultTimings = []string{"ORDO_POLL_INTERVAL=1s", "ORDO_LEASE_TTL=2s"}

// enqueueBurst commits burstRows rows over burstKeys keys in one
// transaction and returns when it has committed.
func (f *fixture) enqueueBurst(t *testing.T) time.Time {
	t.Helper()
	msgs := make([]outbox.Message, burstRows)
	for i := range msgs {
		msgs[i] = outbox.Message{
			CorrelationID: fmt.Sprintf("burst-%d", i%burstKeys), Exchange: f.exchange,
			RoutingKey: "burst", Type: "burst.v1", Payload: json.RawMessage(`{"n":1}`),
		}
	}
	ctx := testkit.Context(t, 120*time.Second)
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		ids, err := f.prod.Enqueue(ctx, tx, msgs...)
		for _, id := range ids {
			f.checker.Expect(id.String())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// awaitDrain waits for every burst row to arrive, in order, and returns the
// drain rate from start.
func (f *fixture) awaitDrain(t *testing.T, start time.Time) float64 {
	t.Helper()
	rep := f.checker.WaitFor(t, 180*time.Second, func(r testkit.Report) bool { return r.Distinct >= burstRows })
	took := time.Since(start)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	return float64(burstRows) / took.Seconds()
}

// awaitWarm waits until every node at urls has read at least reads times
// since it started: with pgx's statement cache, the sixth execution of a
// prepared statement may switch it to a cached generic plan, made for the
// empty table.
func awaitWarm(t *testing.T, urls []string, reads int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, u := range urls {
		for {
			var st node.Status
			getJSON(t, u+"/status", &st)
			if st.Relay.Reads >= reads {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: only %d reads after 60s", u, st.Relay.Reads)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// startNodes starts n nodes (gossiping when n > 1) with the default poll
// and lease settings and returns their HTTP base URLs once every partition
// is held.
func (f *fixture) startNodes(t *testing.T, n int) []string {
	t.Helper()
	if n == 1 {
		_, u := f.start(t, "burst-node", defaultTimings...)
		waitHeld(t, []string{u}, 64)
		return []string{u}
	}
	c := newCluster(t, f, n, defaultTimings...)
	c.waitConverged(t, allNodes(n), 60*time.Second)
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://" + c.http[i]
	}
	waitHeld(t, urls, 64)
	return urls
}

func allNodes(n int) []int {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	return all
}

// waitHeld waits until the nodes at urls hold want partitions between them.
func waitHeld(t *testing.T, urls []string, want int) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, fmt.Sprintf("the nodes hold %d partitions", want), func() bool {
		held := 0
		for _, u := range urls {
			var st node.Status
			getJSON(t, u+"/status", &st)
			held += len(st.Held)
		}
		return held == want
	})
}

// TestIdleThenBurst: nodes that sat idle on an empty outbox, their
// statements warmed, deliver a burst of 40,000 rows committed in one
// transaction, in order. (Nodes started on a backlog: the bench's drain
// and shapes, and node's large-backlog tests; this test no longer drains
// the burst a second time that way only to log its rate.) Before the fix
// they published nothing, for good: a generic plan cached on the empty
// table made every read take seconds, and every row read was then thrown
// away against a lease snapshot taken before the read.
func TestIdleThenBurst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   int
		analyze bool
	}{
		{"one node", 1, false},
		{"one node, analyzed empty table", 1, true},
		{"three nodes", 3, false},
		{"three nodes, analyzed empty table", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.analyze {
				if _, err := f.pool.Exec(ctx30(t), `ANALYZE outbox`); err != nil {
					t.Fatal(err)
				}
			}
			urls := f.startNodes(t, tc.nodes)
			awaitWarm(t, urls, 8)
			rate := f.awaitDrain(t, f.enqueueBurst(t))
			t.Logf("%s: burst after idle drained at %.0f msg/s", tc.name, rate)
		})
	}
}
