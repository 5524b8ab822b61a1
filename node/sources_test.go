package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/wire"
)

// sourceRig is two outbox databases ("default" and "billing") on the
// shared PostgreSQL, each published to an exchange of its own with a
// checker on it, so that each checker checks per-key order within one
// source: per (source, key) order. The two use the same keys.
type sourceRig struct {
	counts    map[string]int // each source's partition count
	dbs       map[string]*testkit.Outbox
	exchanges map[string]string
	checkers  map[string]*testkit.Checker
}

func newSourceRig(t *testing.T, partitions int) *sourceRig {
	return newSourceRigCounts(t, map[string]int{wire.DefaultSource: partitions, "billing": partitions})
}

// newSourceRigCounts is newSourceRig with a partition count per source.
func newSourceRigCounts(t *testing.T, counts map[string]int) *sourceRig {
	r := &sourceRig{counts: counts, dbs: map[string]*testkit.Outbox{},
		exchanges: map[string]string{}, checkers: map[string]*testkit.Checker{}}
	for _, name := range []string{wire.DefaultSource, "billing"} {
		r.dbs[name] = testkit.NewOutbox(t, counts[name], 3)
		r.exchanges[name] = testkit.NewExchange(t)
		r.checkers[name] = testkit.NewChecker(t, testkit.AMQPURL(), r.exchanges[name])
	}
	return r
}

// enqueue commits one message of key to source's outbox and expects it.
func (r *sourceRig) enqueue(ctx context.Context, source, key string) error {
	ob := r.dbs[source]
	var id string
	err := pgx.BeginFunc(ctx, ob.Pool, func(tx pgx.Tx) error {
		ids, err := ob.Producer.Enqueue(ctx, tx, outbox.Message{CorrelationID: key, Exchange: r.exchanges[source],
			RoutingKey: "m", Type: "t", Payload: json.RawMessage(`{}`)})
		if err == nil {
			id = ids[0].String()
		}
		return err
	})
	if err == nil {
		r.checkers[source].Expect(id) // only once committed
	}
	return err
}

// load enqueues into both sources, the same keys in each, until ctx ends,
// and returns how many it committed per source.
func (r *sourceRig) load(ctx context.Context) map[string]int {
	n := map[string]int{}
	for i := 0; ctx.Err() == nil; i++ {
		key := fmt.Sprintf("k%d", i%50)
		for _, s := range []string{wire.DefaultSource, "billing"} {
			// A source cut off for some node is still reachable for the
			// producer: only node links are cut.
			if r.enqueue(ctx, s, key) == nil {
				n[s]++
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return n
}

// twoSources returns the config of a node named name relaying r's two
// databases, billing's through billingURL.
func twoSources(r *sourceRig, billingURL, name string, partitions int) node.Config {
	cfg := node.DefaultConfig()
	cfg.Sources = []node.Source{
		{Name: wire.DefaultSource, PostgresURL: r.dbs[wire.DefaultSource].URL},
		{Name: "billing", PostgresURL: billingURL},
	}
	cfg.AMQP.URL, cfg.NodeName, cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = testkit.AMQPURL(), name, "127.0.0.1:0", partitions, 3
	return cfg
}

// sourceStatus fetches a node's /status and returns its sources by name.
func sourceStatus(httpAddr string) map[string]node.SourceStatus {
	resp, err := http.Get("http://" + httpAddr + "/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st node.Status
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil
	}
	out := map[string]node.SourceStatus{}
	for _, s := range st.Sources {
		out[s.Name] = s
	}
	return out
}

// TestTwoSourcesThreeNodes: three nodes relay two outbox databases at
// once, under load on both. One node's link to the billing database is
// cut: it steps aside for billing only (the others take billing's
// partitions, it keeps its default ones, and default never stops), then
// a node stops. Per (source, key) order holds and nothing is lost.
func TestTwoSourcesThreeNodes(t *testing.T) {
	// Not parallel: three nodes on two databases need the shared servers
	// less loaded than the package's parallel tests make them.
	testkit.RequireRabbitMQ(t)
	const partitions = 12
	r := newSourceRig(t, partitions)
	names := []string{"n1", "n2", "n3"}
	gossip := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	pgAddr := testkit.HostPort(t, r.dbs["billing"].URL)
	cuts := make([]*testkit.Proxy, 3) // each node's own link to billing
	httpAddrs := make([]string, 3)
	stops := make([]func(), 3)
	defer func() {
		for _, stop := range stops {
			if stop != nil {
				stop()
			}
		}
	}()
	for i, name := range names {
		cuts[i] = testkit.NewProxy(t, pgAddr)
		cfg := twoSources(r, cuts[i].URL(r.dbs["billing"].URL), name, partitions)
		cfg.Gossip.BindAddr, cfg.Gossip.Join, cfg.Gossip.RejoinInterval = gossip[i], gossip, time.Second
		cfg.Gossip.Insecure = true
		cfg.LeaseTTL = 5 * time.Second // the shared machine is loaded: no flapping
		cfg.Relay.PollInterval = 200 * time.Millisecond
		httpAddrs[i], stops[i] = runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn).With("node", name)})
	}
	// held returns how many partitions of source the nodes idx hold.
	held := func(source string, idx ...int) int {
		n := 0
		for _, i := range idx {
			n += len(sourceStatus(httpAddrs[i])[source].Held)
		}
		return n
	}
	for _, s := range []string{wire.DefaultSource, "billing"} {
		testkit.WaitFor(t, 60*time.Second, s+" spread over three nodes", func() bool {
			for i := range 3 {
				if len(sourceStatus(httpAddrs[i])[s].Held) != partitions/3 {
					return false
				}
			}
			return true
		})
	}

	loadCtx, stopLoad := context.WithCancel(context.Background())
	var produced map[string]int
	done := make(chan struct{})
	go func() { defer close(done); produced = r.load(loadCtx) }()
	defer func() { stopLoad(); <-done }()
	time.Sleep(500 * time.Millisecond)

	n3default := len(sourceStatus(httpAddrs[2])[wire.DefaultSource].Held)
	cuts[2].Cut()
	cutAt := time.Now()
	testkit.WaitFor(t, 60*time.Second, "n1 and n2 hold every billing partition", func() bool {
		return held("billing", 0, 1) == partitions
	})
	t.Logf("billing moved off n3 %v after its link was cut", time.Since(cutAt).Round(time.Millisecond))
	testkit.WaitFor(t, 30*time.Second, "n3 holds its default share while cut off from billing", func() bool {
		return held(wire.DefaultSource, 2) == n3default
	})
	if st := sourceStatus(httpAddrs[2]); st["billing"].Reachable || !st[wire.DefaultSource].Reachable {
		t.Fatalf("n3's /status: billing reachable %v, default reachable %v; want false, true",
			st["billing"].Reachable, st[wire.DefaultSource].Reachable)
	}
	cuts[2].Restore()
	testkit.WaitFor(t, 30*time.Second, "n3 takes its billing share back", func() bool {
		return held("billing", 2) == partitions/3
	})

	stops[1]()
	testkit.WaitFor(t, 30*time.Second, "n1 and n3 hold every partition of both sources", func() bool {
		return held("billing", 0, 2) == partitions && held(wire.DefaultSource, 0, 2) == partitions
	})
	time.Sleep(500 * time.Millisecond)
	stopLoad()
	<-done
	for _, s := range []string{wire.DefaultSource, "billing"} {
		rep := r.checkers[s].WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
		t.Logf("source %s, %d messages: %s", s, produced[s], rep)
		if !rep.OK() {
			t.Fatalf("source %s: %s", s, rep.Detail())
		}
	}
}

// TestSourceHeader: every message carries x-ordo-source with its
// source's name, default's included, and wire.Source reads it back.
func TestSourceHeader(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	r := newSourceRig(t, 4)
	_, stop := runNode(t, twoSources(r, r.dbs["billing"].URL, "h1", 4), node.Options{Logger: testkit.Logger(t, slog.LevelWarn)})
	defer stop()

	conn, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{wire.DefaultSource: wire.DefaultSource, "billing": "billing"}
	for source, header := range want {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err == nil {
			err = ch.QueueBind(q.Name, "#", r.exchanges[source], false, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := r.enqueue(testkit.Context(t, 10*time.Second), source, "same-key"); err != nil {
			t.Fatal(err)
		}
		var d amqp.Delivery
		testkit.WaitFor(t, 30*time.Second, "a message of "+source, func() bool {
			var ok bool
			d, ok, err = ch.Get(q.Name, true)
			return ok || err != nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Headers[wire.HeaderSource]; got != header {
			t.Errorf("source %s: %s = %#v, want %#v", source, wire.HeaderSource, got, header)
		}
		if got, err := wire.Source(d.Headers); err != nil || got != source {
			t.Errorf("source %s: wire.Source reads %q, %v", source, got, err)
		}
	}
}

// TestConfigValidateSources: Validate reports every problem of Sources at
// once, each at the field Sources: a bad name, a repeated one, an item
// without a name or URL, and more sources than gossip carries.
func TestConfigValidateSources(t *testing.T) {
	c := node.DefaultConfig()
	c.Sources = []node.Source{{Name: "a", PostgresURL: "postgres://h/a"}, {Name: "b", PostgresURL: "postgres://h/b"}}
	if err := c.Validate(); err != nil {
		t.Fatalf("two good sources refused: %v", err)
	}
	c.Sources = []node.Source{{Name: "Bad", PostgresURL: "postgres://h/a"}, {Name: "a", PostgresURL: "postgres://h/a"},
		{Name: "a", PostgresURL: "postgres://h/b"}, {Name: "", PostgresURL: ""}}
	err := c.Validate()
	for _, want := range []string{`source "Bad"`, `source "a" is given twice`, "want NAME=POSTGRES_URL"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not say %q: %v", want, err)
		}
	}
	if got := confcheck.Fields(err); !slices.Equal(got, []string{"Sources", "Sources", "Sources"}) {
		t.Errorf("fields %v, want Sources three times", got)
	}
	c.Sources = nil
	for i := range node.MaxSources + 1 {
		c.Sources = append(c.Sources, node.Source{Name: fmt.Sprintf("s%d", i), PostgresURL: "postgres://h/x"})
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "at most 12") {
		t.Errorf("%d sources: %v", len(c.Sources), err)
	}
}

// TestBusySourceDoesNotDelayAnother: with a deep backlog in default and a
// small confirm window, messages committed to billing are published
// while default is still draining, each within seconds of its commit:
// the relays share W through a relay.Budget, where default may use more
// than its fair share (W/2) only while billing has nothing waiting, so
// billing never queues behind default's backlog.
func TestBusySourceDoesNotDelayAnother(t *testing.T) {
	// Not parallel: three nodes on two databases need the shared servers
	// less loaded than the package's parallel tests make them.
	testkit.RequireRabbitMQ(t)
	const partitions, backlog, trickle = 4, 20000, 20
	r := newSourceRig(t, partitions)
	def := r.dbs[wire.DefaultSource]
	msgs := make([]outbox.Message, 500)
	for i := 0; i < backlog; i += len(msgs) {
		for j := range msgs {
			msgs[j] = outbox.Message{CorrelationID: fmt.Sprintf("k%d", (i+j)%200), Exchange: r.exchanges[wire.DefaultSource],
				RoutingKey: "m", Type: "t", Payload: json.RawMessage(`{}`)}
		}
		def.Enqueue(t, r.checkers[wire.DefaultSource], msgs...)
	}
	cfg := twoSources(r, r.dbs["billing"].URL, "busy", partitions)
	cfg.Relay.Window, cfg.DBMaxConns = 16, 4
	cfg.LeaseTTL = 5 * time.Second // reads may take seconds on the loaded shared machine
	_, stop := runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn)})
	defer stop()

	r.checkers[wire.DefaultSource].WaitFor(t, 60*time.Second, func(rep testkit.Report) bool { return rep.Distinct > 0 })
	committed := map[string]time.Time{}
	for i := range trickle {
		key := fmt.Sprintf("b%d", i)
		if err := r.enqueue(testkit.Context(t, 10*time.Second), "billing", key); err != nil {
			t.Fatal(err)
		}
		committed[key] = time.Now()
		time.Sleep(20 * time.Millisecond)
	}
	rep := r.checkers["billing"].WaitFor(t, 30*time.Second, func(rep testkit.Report) bool { return rep.Lost == 0 })
	left := def.Pending(t)
	var worst time.Duration
	for _, d := range r.checkers["billing"].Deliveries() {
		worst = max(worst, d.Received.Sub(committed[d.CorrelationID]))
	}
	t.Logf("billing: %s; slowest commit to delivery %v; default still had %d of %d pending", rep, worst.Round(time.Millisecond), left, backlog)
	if !rep.OK() {
		t.Fatalf("billing: %s", rep.Detail())
	}
	if left == 0 {
		t.Fatalf("default drained before billing's %d messages were all delivered: the test shows nothing", trickle)
	}
	if worst > 10*time.Second {
		t.Fatalf("a billing message took %v from commit to delivery behind default's backlog", worst)
	}
}
