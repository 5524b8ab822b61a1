package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// ordoHeaders are valid ordering headers of key_seq 1 in partition p.
func ordoHeaders(p int32) amqp.Table {
	return amqp.Table{"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": p}
}

// TestUnstorableTextInvalid: a delivery whose text PostgreSQL cannot
// store (a NUL byte or invalid UTF-8 in the correlation id, message id,
// type, exchange, routing key, a header name or a header string, nested
// ones included) is invalid input, refused by FromDelivery, and by
// Store.Handle for a Message built by hand, before anything is written.
func TestUnstorableTextInvalid(t *testing.T) {
	nested := func(v any) amqp.Table {
		h := ordoHeaders(0)
		h["nested"] = amqp.Table{"list": []any{"ok", v}}
		return h
	}
	for _, tc := range []struct {
		name string
		edit func(d *amqp.Delivery)
	}{
		{"correlation id with NUL", func(d *amqp.Delivery) { d.CorrelationId = "k\x00" }},
		{"correlation id not UTF-8", func(d *amqp.Delivery) { d.CorrelationId = "k\xff" }},
		{"message id with NUL", func(d *amqp.Delivery) { d.MessageId = "m\x00" }},
		{"type not UTF-8", func(d *amqp.Delivery) { d.Type = "t\xc3" }},
		{"exchange with NUL", func(d *amqp.Delivery) { d.Exchange = "ex\x00" }},
		{"routing key not UTF-8", func(d *amqp.Delivery) { d.RoutingKey = "rk\xfe" }},
		{"header string with NUL", func(d *amqp.Delivery) { d.Headers["trace"] = "a\x00b" }},
		{"header name not UTF-8", func(d *amqp.Delivery) { d.Headers["bad\xff"] = "v" }},
		{"nested header string", func(d *amqp.Delivery) { d.Headers = nested("x\x00") }},
		{"cloudEvents:subject standing in, with NUL", func(d *amqp.Delivery) {
			d.CorrelationId = ""
			d.Headers["cloudEvents:subject"] = "s\x00"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &amqp.Delivery{MessageId: "m1", CorrelationId: "k", Type: "t", Exchange: "ex", RoutingKey: "rk",
				Headers: ordoHeaders(0), Body: []byte("{}")}
			tc.edit(d)
			if _, err := inbox.FromDelivery(d); !errors.Is(err, inbox.ErrInvalidMessage) {
				t.Fatalf("FromDelivery: %v, want ErrInvalidMessage", err)
			}
		})
	}
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	for _, corr := range []string{"k\x00", "k\xff"} {
		m := msg(corr, 1, 0)
		_, err := s.Handle(testkit.Context(t, 10*time.Second), inbox.Fence{}, m, recordHandler(""))
		if !errors.Is(err, inbox.ErrInvalidMessage) {
			t.Fatalf("Handle of correlation id %q: %v, want ErrInvalidMessage", corr, err)
		}
	}
	if st := s.Stats(); st.Invalid != 2 || st.Handled != 0 {
		t.Fatalf("stats %+v, want 2 invalid, none handled", st)
	}
}

// TestUnstorableDataIsTheMessagesProblem: data of a message that passes
// FromDelivery but that PostgreSQL refuses (SQLSTATE class 22: here an
// AMQP timestamp past PostgreSQL's last timestamp) is a problem of that
// message, reported as ErrInvalidMessage at once: not a database error to
// retry.
func TestUnstorableDataIsTheMessagesProblem(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	m := msg("k", 1, 0)
	m.Timestamp = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := testkit.Context(t, 10*time.Second)
	_, err := s.Handle(ctx, inbox.Fence{}, m, recordHandler(""))
	if !errors.Is(err, inbox.ErrInvalidMessage) {
		t.Fatalf("Handle: %v, want ErrInvalidMessage", err)
	}
	if got := handledSeqs(t, pool); len(got) != 0 {
		t.Fatalf("handled %v, want nothing committed", got)
	}
	// The key is not held by it: the next message of the key is handled.
	if out := handle(t, s, inbox.Fence{}, msg("k", 1, 0), recordHandler("")); out != inbox.Handled {
		t.Fatalf("the key's next message: %v", out)
	}
}

// TestUnstorableHandlerErrorStored: a handler error whose text has a NUL
// byte or invalid UTF-8 is made storable: the failure is stored, retried
// and the message handled once.
func TestUnstorableHandlerErrorStored(t *testing.T) {
	_, pool := newDB(t)
	cfg := inbox.LocalConfig("t")
	cfg.MaxAttempts = 5
	s := newStore(t, cfg, pool, nil)
	var runs atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if runs.Add(1) <= 2 {
			return fmt.Errorf("driver said \x00 then \xff (run %d)", runs.Load())
		}
		return recordHandler("")(ctx, tx, m)
	}
	ctx := testkit.Context(t, 30*time.Second)
	out, err := s.Handle(ctx, inbox.Fence{}, msg("k", 1, 0), h)
	if err != nil || out != inbox.Retrying {
		t.Fatalf("first run: %v %v, want retrying", out, err)
	}
	var lastErr string
	if err := pool.QueryRow(ctx, `SELECT last_error FROM ordo_inbox_messages WHERE correlation_id = 'k'`).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !utf8.ValidString(lastErr) || strings.ContainsRune(lastErr, 0) || !strings.Contains(lastErr, "driver said") {
		t.Fatalf("stored error %q", lastErr)
	}
	testkit.WaitFor(t, 20*time.Second, "k handled", func() bool {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, h); err != nil {
			t.Fatal(err)
		}
		return len(handledSeqs(t, pool)["k"]) == 1
	})
	if n := runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"k": 1})
}

// TestUnstorableDeliveriesKeepShardFlowing: deliveries PostgreSQL cannot
// store, more of them than the shard has lanes, are dead-lettered raw and
// counted (ordo_inbox_invalid_total), and the shard's other messages keep
// flowing past them, a handler failing once with an error text PostgreSQL
// cannot store included.
func TestUnstorableDeliveriesKeepShardFlowing(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 2
	var failed atomic.Bool
	record := recordHandler("a")
	r := startConsumer(t, cfg, "a", pool, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.CorrelationID == "fails-once" && failed.CompareAndSwap(false, true) {
			return errors.New("bad bytes \x00\xff")
		}
		return record(ctx, tx, m)
	})
	testkit.WaitFor(t, 30*time.Second, "shard owned", func() bool { return len(r.c.Owned()) == 1 })
	pub := newPublisher(t, cfg.Exchange)
	bad := []struct{ key, id string }{{"k\x00", "nul"}, {"k\xff", "utf8"}, {"k2\x00", "nul2"}, {"k2\xfe", "utf8-2"}}
	for _, b := range bad {
		pub.publishRaw(b.key, ordoHeaders(0), b.id)
	}
	h := ordoHeaders(0)
	h["trace"] = "x\x00"
	pub.publishRaw("k3", h, "nul-header")
	stamp := amqp.Table{"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(0)}
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(context.Background(), cfg.Exchange, "order.placed", false, false, amqp.Publishing{
			Headers: stamp, CorrelationId: "far-future", MessageId: "far-future", DeliveryMode: amqp.Persistent,
			Timestamp: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC), Body: []byte(`{}`),
		})
	})
	want := map[string]int64{"fails-once": 2}
	pub.publish("fails-once", 1)
	pub.publish("fails-once", 2)
	for i := range 4 {
		key := fmt.Sprintf("ok%d", i)
		pub.publish(key, 1)
		want[key] = 1
	}
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	testkit.WaitFor(t, 30*time.Second, "6 dead letters", func() bool { return queueDepth(t, r.c.Topology().DeadQueue()) == 6 })
	if st := r.c.Stats(); st.Invalid != 6 || !failed.Load() {
		t.Fatalf("stats %+v (failed once: %v), want 6 invalid", st, failed.Load())
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.c.Collector())
	if v := gather(t, reg, cfg.Name)["ordo_inbox_invalid_total"]; v != 6 {
		t.Fatalf("ordo_inbox_invalid_total %v, want 6", v)
	}
}
