package outbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestEnqueueStoresSpanContext: with a span context in ctx, Enqueue
// stores its traceparent and tracestate in each message's headers,
// except where the message sets its own traceparent (the caller's wins),
// and without copying into the caller's header map; without one it adds
// nothing.
func TestEnqueueStoresSpanContext(t *testing.T) {
	t.Parallel()
	pool, p := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	ts, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 1}, SpanID: trace.SpanID{0xf0, 2}, TraceFlags: trace.FlagsSampled, TraceState: ts})
	traced := trace.ContextWithSpanContext(ctx, sc)
	own := msg("own")
	own.Headers = map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	plain := msg("plain")
	plain.Headers = map[string]any{"tenant": "acme"}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := p.Enqueue(traced, tx, plain, own); err != nil {
			return err
		}
		_, err := p.Enqueue(ctx, tx, msg("untraced"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Headers) != 1 {
		t.Errorf("the caller's header map was changed: %v", plain.Headers)
	}
	want := map[string]map[string]any{
		"plain":    {"tenant": "acme", "traceparent": "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01", "tracestate": "vendor=x"},
		"own":      {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"untraced": {},
	}
	rows, err := pool.Query(ctx, `SELECT correlation_id, headers FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		key string
		h   map[string]any
	}, error) {
		var x struct {
			key string
			h   map[string]any
		}
		return x, r.Scan(&x.key, &x.h)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for _, g := range got {
		w := want[g.key]
		if len(g.h) != len(w) {
			t.Errorf("%s: headers %v, want %v", g.key, g.h, w)
			continue
		}
		for k, v := range w {
			if g.h[k] != v {
				t.Errorf("%s: headers %v, want %v", g.key, g.h, w)
			}
		}
	}
}
