package testkit

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// msg builds a delivery of key with key_seq seq; prev < 0 means no
// x-ordo-prev-key-seq header.
func msg(id, key string, seq, prev int64) Delivery {
	d := Delivery{MessageID: id, CorrelationID: key, KeySeq: seq}
	if prev >= 0 {
		d.PrevKeySeq, d.HasPrevKeySeq = prev, true
	}
	return d
}

func TestCheckerRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		expect []string
		in     []Delivery
		want   Report // Problems and LostIDs are checked by length only
		ok     bool
		// expectLate calls Expect after recording instead of before.
		expectLate bool
	}{
		{
			name: "in order, two interleaved keys",
			in: []Delivery{
				msg("a1", "a", 1, 0), msg("b1", "b", 1, -1), msg("a2", "a", 2, 1),
				msg("b2", "b", 2, -1), msg("a3", "a", 3, 2),
			},
			want: Report{Total: 5, Distinct: 5, Keys: 2},
			ok:   true,
		},
		{
			name: "duplicate counts as duplicate only",
			in:   []Delivery{msg("a1", "a", 1, 0), msg("a2", "a", 2, 1), msg("a1", "a", 1, 0), msg("a3", "a", 3, 2)},
			want: Report{Total: 4, Distinct: 3, Duplicates: 1, Keys: 1},
			ok:   true,
		},
		{
			name: "swapped pair is a reorder",
			in:   []Delivery{msg("a1", "a", 1, 0), msg("a3", "a", 3, 2), msg("a2", "a", 2, 1)},
			want: Report{Total: 3, Distinct: 3, Reorders: 1, Gaps: 1, Keys: 1},
		},
		{
			name: "swapped pair without prev header is a reorder",
			in:   []Delivery{msg("a2", "a", 2, -1), msg("a1", "a", 1, -1)},
			want: Report{Total: 2, Distinct: 2, Reorders: 1, Gaps: 1, Keys: 1},
		},
		{
			name: "missing middle message is a gap",
			in:   []Delivery{msg("a1", "a", 1, 0), msg("a3", "a", 3, 2)},
			want: Report{Total: 2, Distinct: 2, Gaps: 1, Keys: 1},
		},
		{
			name: "missing middle message without prev header is a gap",
			in:   []Delivery{msg("a1", "a", 1, -1), msg("a3", "a", 3, -1)},
			want: Report{Total: 2, Distinct: 2, Gaps: 1, Keys: 1},
		},
		{
			name: "skip explained by prev_key_seq is not a gap",
			in:   []Delivery{msg("a1", "a", 1, 0), msg("a4", "a", 4, 1), msg("a5", "a", 5, 4)},
			want: Report{Total: 3, Distinct: 3, Keys: 1},
			ok:   true,
		},
		{
			name: "first message after skipped ones",
			in:   []Delivery{msg("a3", "a", 3, 0)},
			want: Report{Total: 1, Distinct: 1, Keys: 1},
			ok:   true,
		},
		{
			name:   "lost ids",
			expect: []string{"a1", "a2", "a3", "a2"},
			in:     []Delivery{msg("a1", "a", 1, 0), msg("x1", "x", 1, 0)},
			want:   Report{Total: 2, Distinct: 2, Lost: 2, Keys: 2},
		},
		{
			name:       "expected and delivered before Expect",
			expect:     []string{"a1"},
			expectLate: true,
			in:         []Delivery{msg("a1", "a", 1, 0)},
			want:       Report{Total: 1, Distinct: 1, Keys: 1},
			ok:         true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewRecorder()
			if tc.expectLate {
				for _, d := range tc.in {
					c.Record(d)
				}
				c.Expect(tc.expect...)
			} else {
				c.Expect(tc.expect...)
				for _, d := range tc.in {
					c.Record(d)
				}
			}
			got := c.Report()
			t.Log(got.Detail())
			if len(got.LostIDs) != got.Lost {
				t.Errorf("LostIDs = %v, want %d ids", got.LostIDs, got.Lost)
			}
			if len(got.Problems) != got.Reorders+got.Gaps {
				t.Errorf("Problems = %q, want %d", got.Problems, got.Reorders+got.Gaps)
			}
			got.LostIDs, got.Problems = nil, nil
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("Report = %v, want %v", got, tc.want)
			}
			if got.OK() != tc.ok {
				t.Errorf("OK = %v, want %v", got.OK(), tc.ok)
			}
			if n := len(c.Deliveries()); n != len(tc.in) {
				t.Errorf("Deliveries has %d, want %d", n, len(tc.in))
			}
		})
	}
}

func TestCheckerLostIDsInExpectOrder(t *testing.T) {
	c := NewRecorder()
	var ids []string
	for i := range 50 {
		ids = append(ids, fmt.Sprintf("m%02d", i))
	}
	c.Expect(ids...)
	c.Record(msg("m00", "k", 1, 0))
	r := c.Report()
	if r.Lost != 49 || len(r.LostIDs) != reportListCap || r.LostIDs[0] != "m01" || r.LostIDs[19] != "m20" {
		t.Fatalf("Lost = %d, LostIDs = %v", r.Lost, r.LostIDs)
	}
}

func TestCheckerProblemsCapped(t *testing.T) {
	c := NewRecorder()
	for i := range 30 {
		c.Record(msg(fmt.Sprint(i), "k", int64(2*i+2), -1)) // every one skips one
	}
	r := c.Report()
	if r.Gaps != 30 || len(r.Problems) != reportListCap {
		t.Fatalf("Gaps = %d, %d problems; want 30 and %d", r.Gaps, len(r.Problems), reportListCap)
	}
	if !strings.Contains(r.String(), "gaps=30") {
		t.Errorf("String = %q", r.String())
	}
}

func TestCheckerConcurrentRecordAndWait(t *testing.T) {
	c := NewRecorder()
	const keys, perKey = 8, 200
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := int64(1); s <= perKey; s++ {
				c.Record(msg(fmt.Sprintf("k%d-%d", k, s), fmt.Sprint("k", k), s, s-1))
			}
		}()
	}
	r := c.WaitDistinct(t, keys*perKey, 30*time.Second)
	wg.Wait()
	if !r.OK() || r.Keys != keys {
		t.Fatalf("report %v", r.Detail())
	}
}

// fatalTB records a Fatal instead of failing the real test.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper()             {}
func (f *fatalTB) Logf(string, ...any) {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func TestCheckerWaitForTimesOut(t *testing.T) {
	c := NewRecorder()
	c.Expect("never")
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.WaitDistinct(f, 1, 20*time.Millisecond)
	}()
	<-done
	if !strings.Contains(f.msg, "not met") || !strings.Contains(f.msg, "lost=1") || !strings.Contains(f.msg, "never") {
		t.Fatalf("failure message = %q, want the timeout and the report", f.msg)
	}
}

// declareExchange declares a topic exchange of t's own, deleted when t ends.
func declareExchange(t *testing.T) string {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := UniqueName(t, "ex")
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ch.ExchangeDelete(name, false, false); err != nil {
			t.Errorf("delete exchange %s: %v", name, err)
		}
	})
	return name
}

// publish sends msgs to exchange with publisher confirms, waiting for each.
func publish(t *testing.T, exchange string, msgs ...amqp.Publishing) {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx := Context(t, 30*time.Second)
	for _, m := range msgs {
		key, _ := m.Headers["rk"].(string)
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, m)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := conf.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %s not confirmed: %v", m.MessageId, err)
		}
	}
}

func TestCheckerRabbitMQ(t *testing.T) {
	RequireRabbitMQ(t)
	ex := declareExchange(t)
	c := NewChecker(t, AMQPURL(), ex)
	if !strings.HasPrefix(c.Queue(), "chk_") {
		t.Errorf("Queue = %q", c.Queue())
	}
	c.Expect("m1", "m2", "m3")
	publish(t, ex,
		amqp.Publishing{MessageId: "m1", CorrelationId: "order-1", Type: "OrderPlaced", Body: []byte(`{"n":1}`),
			Headers: amqp.Table{"rk": "order.placed", wire.HeaderKeySeq: int64(1), wire.HeaderPrevKeySeq: int64(0), wire.HeaderPartition: int32(42), wire.HeaderEpoch: int64(7)}},
		amqp.Publishing{MessageId: "m2", CorrelationId: "order-1", Type: "OrderPaid",
			Headers: amqp.Table{"rk": "order.paid", wire.HeaderKeySeq: int16(2), wire.HeaderPrevKeySeq: int8(1), wire.HeaderPartition: uint16(42), wire.HeaderEpoch: uint32(7)}},
		amqp.Publishing{MessageId: "m2", CorrelationId: "order-1", Type: "OrderPaid",
			Headers: amqp.Table{"rk": "order.paid", wire.HeaderKeySeq: int16(2), wire.HeaderPrevKeySeq: int8(1), wire.HeaderPartition: uint16(42), wire.HeaderEpoch: uint32(7)}},
		amqp.Publishing{MessageId: "m3", CorrelationId: "order-2", Type: "OrderPlaced",
			Headers: amqp.Table{"rk": "order.placed", wire.HeaderKeySeq: uint8(1), wire.HeaderPartition: int64(3), wire.HeaderEpoch: int32(1)}},
	)
	r := c.WaitFor(t, 30*time.Second, func(r Report) bool { return r.Total >= 4 })
	if !r.OK() || r.Distinct != 3 || r.Duplicates != 1 || r.Keys != 2 {
		t.Fatalf("report: %s", r.Detail())
	}
	ds := c.Deliveries()
	want := []Delivery{
		{MessageID: "m1", CorrelationID: "order-1", Type: "OrderPlaced", RoutingKey: "order.placed", KeySeq: 1, PrevKeySeq: 0, HasPrevKeySeq: true, Partition: 42, Epoch: 7, Body: []byte(`{"n":1}`)},
		{MessageID: "m2", CorrelationID: "order-1", Type: "OrderPaid", RoutingKey: "order.paid", KeySeq: 2, PrevKeySeq: 1, HasPrevKeySeq: true, Partition: 42, Epoch: 7},
		{MessageID: "m2", CorrelationID: "order-1", Type: "OrderPaid", RoutingKey: "order.paid", KeySeq: 2, PrevKeySeq: 1, HasPrevKeySeq: true, Partition: 42, Epoch: 7},
		{MessageID: "m3", CorrelationID: "order-2", Type: "OrderPlaced", RoutingKey: "order.placed", KeySeq: 1, Partition: 3, Epoch: 1},
	}
	if len(ds) != len(want) {
		t.Fatalf("%d deliveries, want %d", len(ds), len(want))
	}
	for i, d := range ds {
		if d.Received.IsZero() {
			t.Errorf("delivery %d: Received not set", i)
		}
		d.Received = time.Time{}
		if len(d.Body) == 0 {
			d.Body = nil
		}
		if fmt.Sprintf("%+v", d) != fmt.Sprintf("%+v", want[i]) {
			t.Errorf("delivery %d:\n got %+v\nwant %+v", i, d, want[i])
		}
	}
}

func TestCheckerBindingKeys(t *testing.T) {
	RequireRabbitMQ(t)
	ex := declareExchange(t)
	c := NewChecker(t, AMQPURL(), ex, "a.*", "c.#")
	// Published in this order on one channel: had b.x been routed to the
	// queue, it would be there before a.x and c.y.z.
	publish(t, ex,
		amqp.Publishing{MessageId: "b", Headers: amqp.Table{"rk": "b.x"}},
		amqp.Publishing{MessageId: "a", Headers: amqp.Table{"rk": "a.x"}},
		amqp.Publishing{MessageId: "c", Headers: amqp.Table{"rk": "c.y.z"}},
	)
	c.WaitDistinct(t, 2, 30*time.Second)
	var ids []string
	for _, d := range c.Deliveries() {
		ids = append(ids, d.MessageID)
	}
	if strings.Join(ids, ",") != "a,c" {
		t.Fatalf("delivered %v, want [a c]", ids)
	}
}

func TestNewCheckerMissingExchangeFails(t *testing.T) {
	RequireRabbitMQ(t)
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewChecker(f, AMQPURL(), UniqueName(t, "missing"))
	}()
	<-done
	if !strings.Contains(f.msg, "bind") || !strings.Contains(f.msg, "404") {
		t.Fatalf("failure message = %q, want a bind error with 404", f.msg)
	}
}
