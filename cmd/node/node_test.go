package main

import (
	stdctx "context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBinaries()
	os.Exit(code)
}

type fixture struct {
	ob       *testkit.Outbox
	dbURL    string
	pool     *pgxpool.Pool
	prod     *outbox.Producer
	exchange string
	checker  *testkit.Checker
	bin      string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	testkit.RequireRabbitMQ(t)
	ob := testkit.NewOutbox(t, 64, 4)
	ex := testkit.NewExchange(t)
	f := &fixture{ob: ob, dbURL: ob.URL, pool: ob.Pool, prod: ob.Producer, exchange: ex,
		checker: testkit.NewChecker(t, testkit.AMQPURL(), ex, "#"),
		bin:     testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")}
	t.Cleanup(func() {
		if t.Failed() {
			f.explainLost(t)
		}
	})
	return f
}

// explainLost logs what the database says about every message the checker
// is still missing, and the leases of their partitions.
func (f *fixture) explainLost(t *testing.T) {
	ctx, cancel := stdctx.WithTimeout(stdctx.Background(), 10*time.Second)
	defer cancel()
	for _, id := range f.checker.Report().LostIDs {
		var part int
		var key, state string
		var keySeq int64
		err := f.pool.QueryRow(ctx, `SELECT o.partition, o.correlation_id, o.key_seq,
			format('processed=%s attempts=%s error=%s parked=%s next=%s lease=%s/%s expires=%s',
				o.processed_at, o.attempts, o.last_error, o.parked_at, o.next_attempt_at, l.owner, l.epoch, l.expires_at)
			FROM outbox o JOIN ordo_leases l ON l.partition = o.partition WHERE o.id = $1`, id).Scan(&part, &key, &keySeq, &state)
		t.Logf("lost %s: partition %d key %s/%d: %s (%v)", id, part, key, keySeq, state, err)
		rows, _ := f.pool.Query(ctx, `SELECT at, node, epoch, event, coalesce(detail, '') FROM ordo_lease_audit
			WHERE partition = $1 ORDER BY at DESC LIMIT 8`, part)
		for rows.Next() {
			var at time.Time
			var node, event, detail string
			var epoch int64
			_ = rows.Scan(&at, &node, &epoch, &event, &detail)
			t.Logf("    audit p%d: %s %s epoch %d %s %s", part, at.Format("15:04:05.000"), node, epoch, event, detail)
		}
		rows.Close()
	}
}

// enqueue writes n messages over keys keys, in transactions of 1,000.
func (f *fixture) enqueue(t *testing.T, n, keys int) {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	for done := 0; done < n; {
		batch := make([]outbox.Message, 0, min(1000, n-done))
		for range cap(batch) {
			batch = append(batch, outbox.Message{
				CorrelationID: fmt.Sprintf("key-%d", done%keys), Exchange: f.exchange,
				RoutingKey: "load", Type: "load.v1", Payload: json.RawMessage(`{"n":1}`),
			})
			done++
		}
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			ids, err := f.prod.Enqueue(ctx, tx, batch...)
			for _, id := range ids {
				f.checker.Expect(id.String())
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// enqueueTo writes n messages of one key to exchange with a routing key, in one
// transaction, and returns their ids (not expected by the checker).
func (f *fixture) enqueueTo(t *testing.T, exchange, key, routingKey string, n int) []uuid.UUID {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{CorrelationID: key, Exchange: exchange, RoutingKey: routingKey, Type: "t", Payload: json.RawMessage(`{}`)}
	}
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = f.prod.Enqueue(ctx, tx, msgs...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func ctx30(t *testing.T) stdctx.Context { return testkit.Context(t, 30*time.Second) }

func (f *fixture) start(t *testing.T, name string, extra ...string) (*testkit.Process, string) {
	t.Helper()
	addr := testkit.FreeAddr(t)
	env := []string{
		"ORDO_POSTGRES_URL=" + f.dbURL,
		"ORDO_AMQP_URL=" + testkit.AMQPURL(),
		"ORDO_NODE_NAME=" + name,
		"ORDO_HTTP_ADDR=" + addr,
		"ORDO_POLL_INTERVAL=200ms",
	}
	env = append(env, extra...)
	for attempt := 1; ; attempt++ {
		p := testkit.StartProcess(t, name, f.bin, nil, env)
		err := p.AwaitOutput("node started", 30*time.Second)
		if err == nil {
			return p, "http://" + addr
		}
		// Another test may have taken the port FreeAddr handed out.
		if attempt == 3 || !strings.Contains(p.Output(), "address already in use") {
			t.Fatal(err)
		}
		addr = testkit.FreeAddr(t)
		gossip := ""
		for _, e := range env {
			if strings.HasPrefix(e, "ORDO_GOSSIP_ADDR=") {
				gossip = testkit.FreeAddr(t)
			}
		}
		env = retarget(env, addr, gossip)
	}
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v: %s", url, err, b)
		}
	}
	return resp.StatusCode
}

// TestSIGTERMUnderLoad: SIGTERM while draining a backlog exits 0 within
// the settle bound, and nothing is marked that the broker did not take.
func TestSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(t, 20000, 2000)
	p, _ := f.start(t, "sigterm-node", "ORDO_SETTLE_TIMEOUT=5s")
	f.checker.WaitDistinct(t, 2000, 30*time.Second)
	sent := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(20 * time.Second)
	t.Logf("exit %d %v after %v", code, err, time.Since(sent).Round(time.Millisecond))
	if err != nil || code != 0 {
		t.Fatalf("node exited %d (%v), want 0", code, err)
	}
	ctx := testkit.Context(t, 30*time.Second)
	rows, err := f.pool.Query(ctx, `SELECT id FROM outbox WHERE processed_at IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	marked, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if len(marked) < 2000 || len(marked) == 20000 {
		t.Fatalf("%d rows marked: want a drain stopped part way", len(marked))
	}
	// Every marked row must have reached the queue; give the consumer time
	// to catch up with what the broker already holds.
	f.checker.WaitDistinct(t, len(marked), 30*time.Second)
	got := map[string]bool{}
	for _, d := range f.checker.Deliveries() {
		got[d.MessageID] = true
	}
	for _, id := range marked {
		if !got[id.String()] {
			t.Fatalf("row %s is marked processed but never reached the broker", id)
		}
	}
	var leased int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM ordo_leases WHERE owner IS NOT NULL`).Scan(&leased); err != nil || leased != 0 {
		t.Fatalf("%d leases still held after a clean stop (%v)", leased, err)
	}
	if rep := f.checker.Report(); rep.Reorders != 0 || rep.Gaps != 0 {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

// TestHTTPEndpoints: /healthz, /readyz and /status of a running node.
func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(t, 10, 5)
	_, base := f.start(t, "http-node")
	if code := getJSON(t, base+"/healthz", nil); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	deadline := time.Now().Add(30 * time.Second)
	for getJSON(t, base+"/readyz", nil) != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/readyz never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.checker.WaitDistinct(t, 10, 30*time.Second)
	// The partitions in /status come from the backlog snapshot, at most a
	// refresh interval (1 s) old: wait for one taken after the claims.
	// Until the node's first snapshot /status answers 503.
	var st node.Status
	for {
		if code := getJSON(t, base+"/status", &st); code != http.StatusOK {
			if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("/status %d", code)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if st.Node != "http-node" || len(st.Leases) != 64 || len(st.Held) != 64 {
			t.Fatalf("status: node %q, %d partitions, %d held", st.Node, len(st.Leases), len(st.Held))
		}
		why := ""
		for _, p := range st.Leases {
			if p.Owner != "http-node" || p.Epoch < 1 || !p.LeaseLive {
				why = fmt.Sprintf("partition %d: owner %q epoch %d live %v", p.Partition, p.Owner, p.Epoch, p.LeaseLive)
				break
			}
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// node status prints the same as a table.
	var out, errOut strings.Builder
	if code := runCommand(&out, &errOut, "status", "-http", strings.TrimPrefix(base, "http://")); code != 0 {
		t.Fatalf("node status: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"node http-node: 64 of 64 partitions held", "MEMBER", "http-node", "PARTITION", "LEASE OWNER"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("node status output lacks %q:\n%s", want, out.String())
		}
	}
	if code := runCommand(&out, &errOut, "status", "-http", testkit.FreeAddr(t)); code != 1 {
		t.Fatalf("node status against nothing: exit %d, want 1", code)
	}
}

// TestPartitionMismatchRefused: a node configured with another P exits 1
// with a message naming both counts.
func TestPartitionMismatchRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := testkit.StartProcess(t, "mismatch", f.bin, []string{"-partitions", "32", "-http-addr", testkit.FreeAddr(t)},
		[]string{"ORDO_POSTGRES_URL=" + f.dbURL, "ORDO_AMQP_URL=" + testkit.AMQPURL()})
	code, err := p.Wait(30 * time.Second)
	if err != nil || code != 1 {
		t.Fatalf("exit %d (%v), want 1", code, err)
	}
	if out := p.Output(); !strings.Contains(out, "installed with 64 partitions") || !strings.Contains(out, "configured with 32") {
		t.Fatalf("output does not explain the mismatch:\n%s", out)
	}
}

func TestParseConfig(t *testing.T) {
	env := map[string]string{"ORDO_CONFIRM_WINDOW": "64", "ORDO_NODE_NAME": "n1"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := parseConfig([]string{"-lease-ttl", "3s", "-gossip-addr", "127.0.0.1:7946", "-join", "a:1, b:2", "-gossip-key", testGossipKey}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Relay.Window != 64 || c.NodeName != "n1" || c.LeaseTTL != 3*time.Second || c.Partitions != 64 || len(c.Gossip.Join) != 2 || c.Gossip.Join[1] != "b:2" {
		t.Fatalf("config %+v", c)
	}
	for _, bad := range [][]string{
		{"-partitions", "0"}, {"-lease-ttl", "10ms"}, {"-lease-ttl", "300ms"}, {"-db-max-conns", "1"}, {"-log-level", "loud"}, {"stray"},
		{"-join", "a:1"}, {"-gossip-key", "short"}, {"-confirm-window", "0"},
		{"-gossip-addr", "127.0.0.1:7946"},
		{"-gossip-addr", "127.0.0.1:7946", "-gossip-insecure", "-gossip-key", testGossipKey},
	} {
		if _, err := parseConfig(bad, lookup, io.Discard); err == nil {
			t.Errorf("parseConfig(%q) accepted", bad)
		}
	}
	// A TTL too short for the lease timing rule is refused at its flag,
	// saying what would do.
	_, err = parseConfig([]string{"-lease-ttl", "300ms"}, lookup, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-lease-ttl") || !strings.Contains(err.Error(), "use at least 400ms") {
		t.Fatalf("-lease-ttl 300ms: %v", err)
	}
	t.Logf("-lease-ttl 300ms: %v", err)
}

// closedPostgresURL points at a port nothing listens on, so a node that
// gets past its flags retries its migrations instead of starting.
func closedPostgresURL(t *testing.T) string {
	return "postgres://postgres@" + testkit.FreeAddr(t) + "/postgres?sslmode=disable&connect_timeout=1"
}

// TestGossipWithoutKeyRefused: -gossip-addr without -gossip-key and without
// -gossip-insecure exits non-zero before touching anything, naming both
// flags.
func TestGossipWithoutKeyRefused(t *testing.T) {
	t.Parallel()
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	p := testkit.StartProcess(t, "no-key", bin, []string{"-gossip-addr", testkit.FreeAddr(t), "-http-addr", testkit.FreeAddr(t)},
		[]string{"ORDO_POSTGRES_URL=" + closedPostgresURL(t), "ORDO_GOSSIP_KEY="})
	code, err := p.Wait(15 * time.Second)
	if err != nil || code == 0 {
		t.Fatalf("exit %d (%v), want a refusal", code, err)
	}
	if out := p.Output(); !strings.Contains(out, "-gossip-key") || !strings.Contains(out, "-gossip-insecure") {
		t.Fatalf("output does not name -gossip-key and -gossip-insecure:\n%s", out)
	}
}

// TestGossipInsecureWarns: with -gossip-insecure the node starts without a
// key and says so in a warning.
func TestGossipInsecureWarns(t *testing.T) {
	t.Parallel()
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	p := testkit.StartProcess(t, "insecure", bin, []string{"-gossip-addr", testkit.FreeAddr(t), "-http-addr", testkit.FreeAddr(t), "-gossip-insecure"},
		[]string{"ORDO_POSTGRES_URL=" + closedPostgresURL(t), "ORDO_GOSSIP_KEY="})
	p.WaitOutput(t, "gossip is not encrypted", 15*time.Second)
	if !strings.Contains(p.Output(), "level=WARN") && !strings.Contains(p.Output(), `"level":"WARN"`) {
		t.Fatalf("the insecure gossip notice is not a warning:\n%s", p.Output())
	}
}

// testGossipKey is a 16-byte gossip key for tests ("0123456789abcdef").
const testGossipKey = "MDEyMzQ1Njc4OWFiY2RlZg=="

// TestParseConfigGossipSecurity: a gossip address needs a key or an
// explicit -gossip-insecure; a node alone needs neither.
func TestParseConfigGossipSecurity(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, c := range []struct {
		name     string
		args     []string
		insecure bool
		err      string
	}{
		{"alone", nil, false, ""},
		{"keyed", []string{"-gossip-addr", "127.0.0.1:7946", "-gossip-key", testGossipKey}, false, ""},
		{"insecure", []string{"-gossip-addr", "127.0.0.1:7946", "-gossip-insecure"}, true, ""},
		{"no key", []string{"-gossip-addr", "127.0.0.1:7946"}, false, "-gossip-key"},
		{"both", []string{"-gossip-addr", "127.0.0.1:7946", "-gossip-key", testGossipKey, "-gossip-insecure"}, false, "-gossip-insecure"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseConfig(c.args, none, io.Discard)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("err %v, want one naming %s", err, c.err)
			case c.err == "" && o.Gossip.Insecure != c.insecure:
				t.Fatalf("Gossip.Insecure = %v, want %v", o.Gossip.Insecure, c.insecure)
			}
		})
	}
}
