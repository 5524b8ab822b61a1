package testkit

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/outbox"
)

// TestOutbox: the fixture's database is migrated at its partition count,
// Enqueue commits and has the checker expect every id, and Pending counts
// the rows.
func TestOutbox(t *testing.T) {
	o := NewOutbox(t, 8, 2)
	var parts int
	if err := o.Pool.QueryRow(Context(t, 30*time.Second), `SELECT partitions FROM ordo_settings`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts != 8 || o.Partitions != 8 {
		t.Errorf("%d partitions installed, want 8", parts)
	}
	c := NewRecorder()
	msg := outbox.Message{CorrelationID: "k", Exchange: "x", RoutingKey: "r", Type: "t", Payload: json.RawMessage(`{}`)}
	ids := o.Enqueue(t, c, msg, msg)
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("Enqueue returned %v", ids)
	}
	if r := c.Report(); r.Lost != 2 {
		t.Errorf("checker expects %d, want the 2 ids", r.Lost)
	}
	if n := o.Pending(t); n != 2 {
		t.Errorf("Pending = %d, want 2", n)
	}
	if n := o.Parked(t); n != 0 {
		t.Errorf("Parked = %d, want 0", n)
	}
	if _, err := o.Pool.Exec(Context(t, 30*time.Second), `UPDATE outbox SET parked_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	o.WaitParked(t, 1, 10*time.Second)
}
