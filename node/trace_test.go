package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/orderapi"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
)

const tracePartitions = 16

// traceEnv is the order API, the inbox and node runs of one test, all
// tracing into one in-memory exporter.
type traceEnv struct {
	t       *testing.T
	dbURL   string
	pool    *pgxpool.Pool
	ex      string
	spans   *tracetest.InMemoryExporter
	tp      *sdktrace.TracerProvider
	api     *httptest.Server
	mu      sync.Mutex
	handled map[string]int // order id -> handler runs
}

func newTraceEnv(t *testing.T) *traceEnv {
	t.Helper()
	testkit.RequireRabbitMQ(t)
	ob := testkit.NewOutbox(t, tracePartitions, 4)
	dbURL, pool := ob.URL, ob.Pool
	if err := orderapi.Migrate(testkit.Context(t, 30*time.Second), pool); err != nil {
		t.Fatal(err)
	}
	e := &traceEnv{t: t, dbURL: dbURL, pool: pool, ex: testkit.NewExchange(t), spans: tracetest.NewInMemoryExporter(),
		handled: map[string]int{}}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.spans))
	t.Cleanup(func() { _ = e.tp.Shutdown(context.Background()) })

	producer, err := outbox.NewProducer(tracePartitions)
	if err != nil {
		t.Fatal(err)
	}
	acfg := orderapi.DefaultConfig()
	acfg.Exchange, acfg.TracerProvider = e.ex, e.tp
	srv, err := orderapi.New(acfg, pool, producer, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.api = httptest.NewServer(srv)
	t.Cleanup(e.api.Close)

	icfg := inbox.DefaultConfig(testkit.UniqueName(t, "c"))
	icfg.LeaseTTL, icfg.Heartbeat, icfg.GapWait = 2*time.Second, 2*time.Second, 2*time.Second
	icfg.RetryMin, icfg.RetryMax, icfg.RetryPoll = 20*time.Millisecond, 500*time.Millisecond, 50*time.Millisecond
	icfg.AMQPURL, icfg.Exchange, icfg.Shards, icfg.Partitions = testkit.AMQPURL(), e.ex, 2, tracePartitions
	icfg.Instance, icfg.TracerProvider = "i1", e.tp
	icfg.Logger = testkit.Logger(t, slog.LevelWarn)
	t.Cleanup(func() { deleteInboxTopology(t, inbox.TopologyOf(icfg)) })
	c, err := inbox.New(icfg, pool, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		e.mu.Lock()
		e.handled[m.CorrelationID]++
		e.mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("inbox Run: %v", err)
		}
	})
	select {
	case <-c.Ready():
	case err := <-done:
		t.Fatalf("inbox Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("inbox not ready within 30s")
	}
	return e
}

// deleteInboxTopology removes the inbox's queues and exchanges.
func deleteInboxTopology(tb testing.TB, topo inbox.Topology) {
	testkit.WithChannel(tb, func(ch *amqp.Channel) error {
		for i := range topo.Shards {
			if _, err := ch.QueueDelete(topo.ShardQueue(i), false, false, false); err != nil {
				return err
			}
		}
		if _, err := ch.QueueDelete(topo.DeadQueue(), false, false, false); err != nil {
			return err
		}
		if err := ch.ExchangeDelete(topo.ShardsExchange(), false, false); err != nil {
			return err
		}
		return ch.ExchangeDelete(topo.UnroutableExchange(), false, false)
	})
}

// startNode runs a node named name until the returned stop is called
// (stop waits for it to end), with wrap, if set, around its publisher.
func (e *traceEnv) startNode(name string, wrap func(relay.Publisher) relay.Publisher) (stop func()) {
	e.t.Helper()
	cfg := node.DefaultConfig()
	cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = e.dbURL, testkit.AMQPURL(), name
	cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", tracePartitions, 3
	cfg.Relay.PollInterval, cfg.Relay.SettleTimeout = 100*time.Millisecond, 200*time.Millisecond
	ready := make(chan string, 1)
	opts := node.Options{
		Logger:         testkit.Logger(e.t, slog.LevelWarn).With("node", name),
		TracerProvider: e.tp,
		Ready:          func(a string) { ready <- a },
	}
	ctx, cancel := context.WithCancel(nodehook.With(context.Background(), nodehook.Hooks{WrapPublisher: wrap}))
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx, cfg, opts) }()
	select {
	case <-ready:
	case err := <-done:
		e.t.Fatalf("node %s: %v", name, err)
	case <-time.After(30 * time.Second):
		e.t.Fatalf("node %s did not start", name)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("node %s: %v", name, err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// placeOrder places an order through the API and returns its id.
func (e *traceEnv) placeOrder() string {
	e.t.Helper()
	body := `{"customerId":"0190f5c2-0000-7000-8000-000000000001","currency":"EUR",` +
		`"items":[{"bookId":"0190f5c3-0000-7000-8000-000000000002","quantity":1,"unitPrice":"9.50"}]}`
	resp, err := http.Post(e.api.URL+"/orders", "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("POST /orders: %s", resp.Status)
	}
	loc := resp.Header.Get("Location")
	return strings.TrimPrefix(loc, "/orders/")
}

// waitSpans waits until the exported spans satisfy cond, and returns them.
func (e *traceEnv) waitSpans(what string, cond func(tracetest.SpanStubs) bool) tracetest.SpanStubs {
	e.t.Helper()
	var got tracetest.SpanStubs
	testkit.WaitFor(e.t, 30*time.Second, what, func() bool {
		got = e.spans.GetSpans()
		return cond(got)
	})
	return got
}

// spansOf returns the spans of kind whose name starts with prefix and
// whose attribute key (if not empty) is val.
func spansOf(all tracetest.SpanStubs, kind trace.SpanKind, prefix string, key attribute.Key, val string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range all {
		if s.SpanKind != kind || !strings.HasPrefix(s.Name, prefix) {
			continue
		}
		if key != "" && attr(s, key) != val {
			continue
		}
		out = append(out, s)
	}
	return out
}

// attr returns the value of s's attribute key as a string, "" if absent.
func attr(s tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func describe(all tracetest.SpanStubs) string {
	var b strings.Builder
	for _, s := range all {
		fmt.Fprintf(&b, "  %s %q trace %s span %s parent %s\n", s.SpanKind, s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID())
	}
	return b.String()
}

// The span names and attributes the checks below look for.
const (
	attrConversation = attribute.Key("messaging.message.conversation_id")
	attrOutcome      = attribute.Key("ordo.outcome")
	attrInboxOutcome = attribute.Key("ordo.inbox.outcome")
)

// theSpans returns the spans of order id: the API's server span of POST
// /orders, and the PRODUCER, CONSUMER and handler spans of its message.
func theSpans(all tracetest.SpanStubs, ex, id string) (server, producers, consumers, handlers []tracetest.SpanStub) {
	return spansOf(all, trace.SpanKindServer, "POST /orders", "", ""),
		spansOf(all, trace.SpanKindProducer, "publish "+ex, attrConversation, id),
		spansOf(all, trace.SpanKindConsumer, "process ", attrConversation, id),
		spansOf(all, trace.SpanKindInternal, "handle "+orderapi.TypeOrderPlaced, attrConversation, id)
}

// TestOneTracePerOrder: one order placed through the API gives one
// trace: the API's server span, the relay's PRODUCER span as its child
// (with the messaging and ordo attributes), the inbox's CONSUMER span as
// the PRODUCER's child, and the handler's span as the CONSUMER's child.
func TestOneTracePerOrder(t *testing.T) {
	t.Parallel()
	e := newTraceEnv(t)
	e.startNode("n1", nil)
	id := e.placeOrder()
	all := e.waitSpans("the order's four spans", func(all tracetest.SpanStubs) bool {
		s, p, c, h := theSpans(all, e.ex, id)
		return len(s) > 0 && len(p) > 0 && len(c) > 0 && len(h) > 0
	})
	s, p, c, h := theSpans(all, e.ex, id)
	if len(s) != 1 || len(p) != 1 || len(c) != 1 || len(h) != 1 {
		t.Fatalf("server %d, producer %d, consumer %d, handler %d spans, want one each:\n%s", len(s), len(p), len(c), len(h), describe(all))
	}
	server, prod, cons, hand := s[0], p[0], c[0], h[0]
	tid := server.SpanContext.TraceID()
	for _, x := range []tracetest.SpanStub{prod, cons, hand} {
		if x.SpanContext.TraceID() != tid {
			t.Errorf("%s is in trace %s, the server span in %s:\n%s", x.Name, x.SpanContext.TraceID(), tid, describe(all))
		}
	}
	for _, pc := range []struct{ child, parent tracetest.SpanStub }{{prod, server}, {cons, prod}, {hand, cons}} {
		if pc.child.Parent.SpanID() != pc.parent.SpanContext.SpanID() {
			t.Errorf("%s's parent is %s, want %s (%s):\n%s", pc.child.Name, pc.child.Parent.SpanID(),
				pc.parent.SpanContext.SpanID(), pc.parent.Name, describe(all))
		}
	}
	for key, want := range map[attribute.Key]string{
		"messaging.system": "rabbitmq", "messaging.destination.name": e.ex, "messaging.operation.type": "send",
		"messaging.rabbitmq.destination.routing_key": orderapi.RoutingKeyOrderPlaced,
		"ordo.key_seq": "1", "ordo.epoch": "1", attrOutcome: "confirmed",
	} {
		if got := attr(prod, key); got != want {
			t.Errorf("PRODUCER span %s = %q, want %q", key, got, want)
		}
	}
	for _, key := range []attribute.Key{"messaging.message.id", "ordo.partition", "ordo.attempt", "ordo.outbox.wait_ms"} {
		if attr(prod, key) == "" {
			t.Errorf("PRODUCER span has no %s: %v", key, prod.Attributes)
		}
	}
	if attr(cons, "messaging.message.id") != attr(prod, "messaging.message.id") || attr(cons, attrInboxOutcome) != "handled" {
		t.Errorf("CONSUMER span attributes %v", cons.Attributes)
	}
}

// dropSettles publishes for real and never reports the outcome: the node
// it wraps behaves like one killed after its write, before the confirm
// was marked (its PRODUCER span never ends, as in a killed process).
type dropSettles struct{ relay.Publisher }

func (d dropSettles) Publish(ctx context.Context, m *relay.Message, _ func(relay.Result)) error {
	return d.Publisher.Publish(ctx, m, func(relay.Result) {})
}

// TestTraceSurvivesRepublish: an order's message published by a node that
// is then killed before its mark is published again by the node's next
// run; the republish's PRODUCER span is again a child of the API's server
// span, and both deliveries' CONSUMER spans are in the order's trace, the
// second one (a duplicate, not handled again) the child of the
// republish's span.
func TestTraceSurvivesRepublish(t *testing.T) {
	t.Parallel()
	e := newTraceEnv(t)
	stopFirst := e.startNode("n1", func(p relay.Publisher) relay.Publisher { return dropSettles{p} })
	id := e.placeOrder()
	e.waitSpans("the first delivery's CONSUMER span", func(all tracetest.SpanStubs) bool {
		_, _, c, _ := theSpans(all, e.ex, id)
		return len(c) == 1
	})
	stopFirst()
	e.startNode("n1", nil)
	all := e.waitSpans("the republish's PRODUCER span and a second CONSUMER span", func(all tracetest.SpanStubs) bool {
		_, p, c, _ := theSpans(all, e.ex, id)
		return len(p) == 1 && len(c) == 2
	})
	s, p, c, h := theSpans(all, e.ex, id)
	if len(s) != 1 || len(h) != 1 {
		t.Fatalf("server %d, handler %d spans, want one each:\n%s", len(s), len(h), describe(all))
	}
	tid, re := s[0].SpanContext.TraceID(), p[0]
	if re.SpanContext.TraceID() != tid || re.Parent.SpanID() != s[0].SpanContext.SpanID() {
		t.Fatalf("the republish's span is not the server span's child:\n%s", describe(all))
	}
	if attr(re, "ordo.epoch") == "1" {
		t.Errorf("the republish went out under epoch 1, the first run's")
	}
	first, second := c[0], c[1]
	if attr(first, attrInboxOutcome) != "handled" {
		first, second = second, first
	}
	for _, x := range []tracetest.SpanStub{first, second} {
		if x.SpanContext.TraceID() != tid {
			t.Errorf("CONSUMER span in trace %s, want the order's %s:\n%s", x.SpanContext.TraceID(), tid, describe(all))
		}
	}
	if attr(first, attrInboxOutcome) != "handled" || attr(second, attrInboxOutcome) != "duplicate" {
		t.Errorf("outcomes %q and %q, want handled and duplicate", attr(first, attrInboxOutcome), attr(second, attrInboxOutcome))
	}
	if second.Parent.SpanID() != re.SpanContext.SpanID() || first.Parent.SpanID() == re.SpanContext.SpanID() {
		t.Errorf("the duplicate's parent is %s, the first delivery's %s; want the republish's %s:\n%s",
			second.Parent.SpanID(), first.Parent.SpanID(), re.SpanContext.SpanID(), describe(all))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.handled[id] != 1 {
		t.Errorf("handled %d times, want once", e.handled[id])
	}
}
