package relay_test

import (
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestCoreLeaseLapsesDuringPublish: a publish that waits for the broker
// longer than its partition's lease has left is given the lease's
// deadline, gives up at it and sends nothing; the row stays pending with
// no attempt charged, and goes once the lease is renewed.
func TestCoreLeaseLapsesDuringPublish(t *testing.T) {
	const ttl = 300 * time.Millisecond
	c := newCore(t, ttl, nil)
	ids := c.store.Insert(1, "k", "k")
	c.pub.Block() // every publish waits, as for a broker answering late
	c.start()
	testkit.WaitFor(t, waitTimeout, "the publish to give up at the lease deadline", func() bool { return c.r.Stats().LeaseSkipped > 0 })
	if sent := c.pub.Sent(); len(sent) != 0 {
		t.Fatalf("%d messages sent past the lease deadline", len(sent))
	}
	for _, id := range ids {
		if row, _ := c.store.Get(id); row.Processed || row.Attempts != 0 {
			t.Fatalf("row %s after a publish that gave up: processed %v, %d attempts; want pending, none", id, row.Processed, row.Attempts)
		}
	}
	c.pub.Unblock()
	c.own.Renew()
	c.waitDrained()
	sent := c.pub.Sent()
	if len(sent) != 2 {
		t.Fatalf("%d messages sent after the renewal, want 2", len(sent))
	}
	for _, m := range sent {
		if m.Deadline.IsZero() || m.Deadline.After(time.Now().Add(ttl)) {
			t.Fatalf("message %s was published with deadline %v: want its lease's", m.ID, m.Deadline)
		}
	}
	if row, _ := c.store.Get(ids[0]); row.Attempts != 0 {
		t.Fatalf("%d attempts charged for a publish that gave up at the deadline", row.Attempts)
	}
}
