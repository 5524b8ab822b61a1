package relay_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// The tests of the relay's memory (memory.go): the relay's count of the
// bytes it holds and its Budget's count of them move together, whatever
// happens to a row, and a parked key is charged nothing to the read-ahead.

// poisonPayload is a payload of about n bytes.
func poisonPayload(n int) json.RawMessage {
	return json.RawMessage(`"` + string(bytes.Repeat([]byte("x"), n)) + `"`)
}

// memCore is a relay on fakes with a Budget of its own, whose publisher
// fails every message of key "poison" (parked after 2 attempts).
func memCore(t *testing.T, readAhead int64) (*core, *relay.Budget) {
	t.Helper()
	budget := relay.NewBudget(16, readAhead)
	c := newCore(t, 0, func(cfg *relay.Config) {
		cfg.MaxAttempts = 2
		cfg.ReadAheadBytes = readAhead
		cfg.Budget = budget
	})
	c.pub.SetFault(func(m *relay.Message) (relay.Result, bool) {
		if m.CorrelationID == "poison" {
			return relay.Result{Outcome: relay.Returned, Err: errors.New("unroutable")}, true
		}
		return relay.Result{}, false
	})
	return c, budget
}

// inStep waits until the Budget counts what the relay counts, and that is
// want (-1: anything), and fails the test otherwise.
func inStep(t *testing.T, c *core, budget *relay.Budget, what string, want int64) {
	t.Helper()
	var mine, its int64
	ok := until(waitTimeout, func() bool {
		mine, its = c.r.Stats().ReadAheadBytes, budget.Stats().BytesUsed
		return mine == its && (want < 0 || mine == want)
	})
	if !ok {
		t.Fatalf("%s: the relay counts %d bytes, its Budget %d (want both %d)", what, mine, its, want)
	}
}

// parkPoison inserts a poison row of payload bytes in partition 1 and
// waits until it is parked and read again parked (the relay's count is
// below the payload's size).
func parkPoison(t *testing.T, c *core, payload int) uuid.UUID {
	t.Helper()
	id := c.store.Insert(1, "poison")[0]
	c.store.Update(id, func(r *relaytest.StoredRow) { r.Payload = poisonPayload(payload) })
	c.start()
	var nudges []uuid.UUID
	testkit.WaitFor(t, waitTimeout, "poison parked", func() bool { r, _ := c.store.Get(id); return r.Parked })
	testkit.WaitFor(t, waitTimeout, "poison read again parked", func() bool {
		nudges = append(nudges, c.store.Insert(2, "nudge")...) // new rows: passes follow, which read the parked row again
		return c.r.Stats().ReadAheadBytes < int64(payload)
	})
	waitProcessed(t, c, "nudges processed", nudges...)
	return id
}

// until polls cond until it returns true (true) or timeout passes (false).
func until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// waitProcessed waits until every row of ids is processed.
func waitProcessed(t *testing.T, c *core, what string, ids ...uuid.UUID) {
	t.Helper()
	testkit.WaitFor(t, waitTimeout, what, func() bool {
		for _, id := range ids {
			if r, _ := c.store.Get(id); !r.Processed {
				return false
			}
		}
		return true
	})
}

// TestMemoryBudgetInStepThroughParking: a row that fails MaxAttempts times
// at full size, is read again parked, and then skipped, purged or handed
// off leaves the Budget's count where the relay's is, at 0; so does a row
// first seen parked and then retried.
func TestMemoryBudgetInStepThroughParking(t *testing.T) {
	const payload = 200 << 10
	for _, end := range []string{"skip", "purge", "handoff"} {
		t.Run(end, func(t *testing.T) {
			c, budget := memCore(t, 150<<10)
			id := parkPoison(t, c, payload)
			inStep(t, c, budget, "parked, read again", -1)
			switch end {
			case "skip":
				c.store.Update(id, func(r *relaytest.StoredRow) { r.Processed, r.Dead = true, true })
			case "purge":
				c.store.Update(id, func(r *relaytest.StoredRow) { r.Processed = true })
			case "handoff":
				waitClosed(t, "revoke acknowledged", c.own.Revoke(1))
			}
			if end != "handoff" {
				c.store.Insert(2, "nudge") // a pass that finds it gone
			}
			inStep(t, c, budget, "after "+end, 0)
			// A hot key drains at a page a read, not a row.
			reads, rows := c.r.Stats().Reads, c.r.Stats().ReadRows
			var hot []uuid.UUID
			for range 300 {
				hot = append(hot, c.store.Insert(3, "hot")...)
			}
			waitProcessed(t, c, "hot key drained", hot...)
			st := c.r.Stats()
			t.Logf("after %s: hot key drained in %d reads, %d rows read", end, st.Reads-reads, st.ReadRows-rows)
			if n := st.Reads - reads; n > 60 {
				t.Errorf("the hot key's 300 rows took %d reads", n)
			}
			inStep(t, c, budget, "hot key drained", 0)
		})
	}
	t.Run("retried", func(t *testing.T) {
		c, budget := memCore(t, 150<<10)
		id := c.store.Insert(1, "poison")[0]
		c.store.Update(id, func(r *relaytest.StoredRow) {
			r.Payload = poisonPayload(payload)
			r.Parked, r.Attempts = true, 2
		})
		c.start()
		testkit.WaitFor(t, waitTimeout, "parked row read", func() bool { return c.r.Stats().Reads > 0 })
		inStep(t, c, budget, "first seen parked", -1)
		c.pub.SetFault(nil)
		c.store.Update(id, func(r *relaytest.StoredRow) { r.Parked, r.Attempts = false, 0 })
		c.store.Insert(2, "nudge")
		c.waitDrained()
		inStep(t, c, budget, "retried and published", 0)
	})
}

// TestMemoryParkedKeysDoNotSlowOthers: parked heads that would fill the
// read-ahead memory leave a hot key's drain at about the reads it takes
// with no parked key: a parked key holds nothing in memory (its head is
// not read, its follower is read marked BehindParked and not kept), so
// memory never counts as full for them.
func TestMemoryParkedKeysDoNotSlowOthers(t *testing.T) {
	const readAhead, hotRows = 48 << 10, 400
	drain := func(t *testing.T, parked int) (reads, rows int64) {
		c := newCore(t, 0, func(cfg *relay.Config) {
			cfg.MaxAttempts = 2
			cfg.ReadAheadBytes = readAhead
		})
		for i := range parked {
			key := fmt.Sprintf("parked-%d", i)
			ids := c.store.Insert(i%coreParts, key, key) // a head and a follower
			c.store.Update(ids[0], func(r *relaytest.StoredRow) {
				r.Payload = poisonPayload(2 << 10)
				r.Parked, r.Attempts = true, 2
			})
		}
		c.start()
		// A read leaves parked rows out and returns their followers
		// marked BehindParked: once every follower was read, nothing of
		// the parked keys is held.
		testkit.WaitFor(t, waitTimeout, "every parked key's follower read", func() bool { return c.r.Stats().ReadRows >= int64(parked) })
		st := c.r.Stats()
		t.Logf("%d rows of parked keys held: %d bytes charged (ReadAheadBytes %d)", st.ReadAhead, st.ReadAheadBytes, readAhead)
		if st.ReadAhead != 0 || st.ReadAheadBytes != 0 {
			t.Errorf("parked keys hold %d rows, %d bytes of the read-ahead", st.ReadAhead, st.ReadAheadBytes)
		}
		var hot []uuid.UUID
		for range hotRows {
			hot = append(hot, c.store.Insert(0, "hot")...)
		}
		waitProcessed(t, c, "hot key drained", hot...)
		end := c.r.Stats()
		return end.Reads - st.Reads, end.ReadRows - st.ReadRows
	}
	baseReads, baseRows := drain(t, 0)
	reads, rows := drain(t, 120)
	t.Logf("a %d-row hot key drained in %d reads (%d rows read) alone, %d reads (%d rows read) beside 120 parked keys",
		hotRows, baseReads, baseRows, reads, rows)
	// The reads a drain takes follow when rows land between reads (5 to
	// 18 alone, 7 to 15 beside the parked keys, in runs on one machine);
	// with the parked keys' rows kept in memory it takes about one read
	// per row (403 against 8).
	if reads > 4*baseReads+20 {
		t.Fatalf("beside 120 parked keys the hot key took %d reads, alone %d", reads, baseReads)
	}
}
