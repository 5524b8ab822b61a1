package orderapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/orderapi"
)

const testPartitions = 16

// Fixed identities used in request bodies.
const (
	customerID = "0190f5c2-7d1e-7a3b-9c4d-5e6f708192a3"
	bookA      = "0190f5c3-0000-7000-8000-00000000000a"
	bookB      = "0190f5c3-0000-7000-8000-00000000000b"
)

// env is one order API over its own database, served by httptest.
type env struct {
	ts       *httptest.Server
	srv      *orderapi.Server
	pool     *pgxpool.Pool
	exchange string
}

// newEnv migrates a fresh database and serves an order API on it. Its log
// goes to tb's output.
func newEnv(tb testing.TB, logger *slog.Logger) *env {
	tb.Helper()
	ob := testkit.NewOutbox(tb, testPartitions, 4)
	pool, producer := ob.Pool, ob.Producer
	if err := orderapi.Migrate(testkit.Context(tb, 30*time.Second), pool); err != nil {
		tb.Fatalf("orderapi.Migrate: %v", err)
	}
	cfg := orderapi.DefaultConfig()
	cfg.Exchange = testkit.UniqueName(tb, "ex")
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(tb.Output(), nil))
	}
	srv, err := orderapi.New(cfg, pool, producer, logger)
	if err != nil {
		tb.Fatalf("orderapi.New: %v", err)
	}
	ts := httptest.NewServer(srv)
	tb.Cleanup(ts.Close)
	return &env{ts: ts, srv: srv, pool: pool, exchange: cfg.Exchange}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// decode unmarshals the body into a map.
func (r response) json(tb testing.TB) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		tb.Fatalf("response body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// errorMessage checks that r is a JSON error and returns its message.
func (r response) errorMessage(tb testing.TB) string {
	tb.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		tb.Errorf("error Content-Type = %q, want application/json", ct)
	}
	m := r.json(tb)
	msg, ok := m["error"].(string)
	if !ok || msg == "" || len(m) != 1 {
		tb.Fatalf("error body = %s, want {\"error\": \"...\"}", r.body)
	}
	return msg
}

// do sends a request. contentType "" sends none.
func (e *env) do(tb testing.TB, method, path, contentType, body string, header http.Header) response {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.ts.URL+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) post(tb testing.TB, path, body string) response {
	tb.Helper()
	return e.do(tb, http.MethodPost, path, "application/json", body, nil)
}

func (e *env) get(tb testing.TB, path string) response {
	tb.Helper()
	return e.do(tb, http.MethodGet, path, "", "", nil)
}

// place posts body and requires a 201, returning the order id and total.
func (e *env) place(tb testing.TB, body string) (id, total string) {
	tb.Helper()
	r := e.post(tb, "/orders", body)
	if r.status != http.StatusCreated {
		tb.Fatalf("POST /orders = %d %s, want 201", r.status, r.body)
	}
	m := r.json(tb)
	id, _ = m["id"].(string)
	total, _ = m["total"].(string)
	return id, total
}

// counts returns the rows in orders, order_items and outbox.
func (e *env) counts(tb testing.TB) (orders, items, messages int) {
	tb.Helper()
	ctx := testkit.Context(tb, 30*time.Second)
	err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM order_items), (SELECT count(*) FROM outbox)`).
		Scan(&orders, &items, &messages)
	if err != nil {
		tb.Fatalf("count rows: %v", err)
	}
	return orders, items, messages
}

// outboxRow is an outbox row as the tests read it.
type outboxRow struct {
	exchange, routingKey, typ, correlationID string
	keySeq                                   int64
	payload                                  map[string]any
	headers                                  map[string]any
}

// messages returns the outbox rows of correlation id key, in key_seq order.
func (e *env) messages(tb testing.TB, key string) []outboxRow {
	tb.Helper()
	ctx := testkit.Context(tb, 30*time.Second)
	rows, err := e.pool.Query(ctx, `
		SELECT exchange, routing_key, type, correlation_id, key_seq, payload, headers
		FROM outbox WHERE correlation_id = $1 ORDER BY key_seq`, key)
	if err != nil {
		tb.Fatalf("select outbox: %v", err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.exchange, &r.routingKey, &r.typ, &r.correlationID, &r.keySeq, &r.payload, &r.headers); err != nil {
			tb.Fatalf("scan outbox: %v", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("select outbox: %v", err)
	}
	return out
}

// orderBody builds a POST /orders body.
func orderBody(currency string, items ...string) string {
	return `{"customerId":"` + customerID + `","currency":"` + currency + `","items":[` + strings.Join(items, ",") + `]}`
}

// itemJSON builds one item; price is inserted as written (quote it for a string).
func itemJSON(book string, quantity string, price string) string {
	return `{"bookId":"` + book + `","quantity":` + quantity + `,"unitPrice":` + price + `}`
}

// compactJSON re-encodes a decoded JSON value for comparison.
func compactJSON(tb testing.TB, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
