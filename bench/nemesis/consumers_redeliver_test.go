package nemesis

import (
	"slices"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// TestRedeliverUndoesSettledMarks runs the redeliver fault's statement on
// a real outbox: it takes the settled rows of the window whose key has
// nothing pending, and leaves the rest alone.
func TestRedeliverUndoesSettledMarks(t *testing.T) {
	o := testkit.NewOutbox(t, 8, 2)
	ctx := testkit.Context(t, 30*time.Second)
	msg := func(key string) outbox.Message {
		return outbox.Message{CorrelationID: key, Exchange: "x", RoutingKey: "r", Type: "t", Payload: []byte(`{}`)}
	}
	ids := map[string]string{}
	for _, name := range []string{"old1", "a1", "a2", "b1", "b2", "c1", "p1", "d1"} {
		key := name[:len(name)-1]
		if key == "p" {
			key = poisonPrefix + "1"
		}
		ids[name] = o.Enqueue(t, nil, msg(key))[0].String()
	}
	mark := func(age string, names ...string) {
		t.Helper()
		var list []string
		for _, n := range names {
			list = append(list, ids[n])
		}
		_, err := o.Pool.Exec(ctx, `UPDATE outbox SET processed_at = clock_timestamp() - $2::interval WHERE id = ANY($1::uuid[])`, list, age)
		if err != nil {
			t.Fatal(err)
		}
	}
	mark("5 seconds", "old1", "a1", "a2", "b1", "p1", "d1") // b2 stays pending
	mark("0 seconds", "c1")                                 // marked just now: maybe not handled yet
	_, err := o.Pool.Exec(ctx, `UPDATE outbox SET dead_at = processed_at WHERE id = $1`, ids["d1"])
	if err != nil {
		t.Fatal(err)
	}
	got, keys, err := redeliver(ctx, o.Pool, 7, time.Second) // the window leaves old1 out
	if err != nil {
		t.Fatal(err)
	}
	want := []string{ids["a1"], ids["a2"]}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || keys != 1 {
		t.Fatalf("redeliver took %v of %d keys, want a1 and a2 (%v) of 1 key", got, keys, want)
	}
	if n := o.Pending(t); n != 3 {
		t.Fatalf("%d rows pending, want 3 (a1, a2 again, and b2)", n)
	}
}
