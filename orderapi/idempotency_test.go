package orderapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/orderapi"
)

// postKeyed posts body to /orders with an Idempotency-Key header.
func (e *env) postKeyed(tb testing.TB, key, body string) response {
	tb.Helper()
	return e.do(tb, http.MethodPost, "/orders", "application/json", body, http.Header{"Idempotency-Key": {key}})
}

// placedCount returns how many OrderPlaced rows the outbox holds.
func (e *env) placedCount(tb testing.TB) int {
	tb.Helper()
	var n int
	err := e.pool.QueryRow(testkit.Context(tb, 30*time.Second), `SELECT count(*) FROM outbox WHERE type = $1`, orderapi.TypeOrderPlaced).Scan(&n)
	if err != nil {
		tb.Fatalf("count OrderPlaced: %v", err)
	}
	return n
}

// TestIdempotencyKeyReplays: a retried POST with the same key and body gets
// the same order and writes nothing; the same key with another body is
// refused with 422.
func TestIdempotencyKeyReplays(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	body := orderBody("EUR", itemJSON(bookA, "2", `"12.50"`))
	first := e.postKeyed(t, "retry-1", body)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST = %d %s", first.status, first.body)
	}
	id := first.json(t)["id"]
	// The same order written differently is the same body.
	same := `{ "items": [{"unitPrice": 12.5, "quantity": 2, "bookId": "` + bookA + `"}], "currency": "EUR", "customerId": "` + customerID + `" }`
	for i, b := range []string{body, same} {
		r := e.postKeyed(t, "retry-1", b)
		if r.status != http.StatusCreated || r.json(t)["id"] != id || r.json(t)["total"] != "25.00" {
			t.Fatalf("replay %d = %d %s, want 201 with id %v and total 25.00", i, r.status, r.body, id)
		}
		if loc := r.header.Get("Location"); loc != "/orders/"+id.(string) {
			t.Errorf("replay Location = %q", loc)
		}
		if r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay lacks Idempotent-Replayed: true")
		}
	}
	if o, _, m := e.counts(t); o != 1 || m != 1 {
		t.Fatalf("after replays: %d orders, %d outbox rows; want 1 and 1", o, m)
	}
	other := e.postKeyed(t, "retry-1", orderBody("EUR", itemJSON(bookA, "3", `"12.50"`)))
	if other.status != http.StatusUnprocessableEntity || !strings.Contains(other.errorMessage(t), "Idempotency-Key") {
		t.Fatalf("same key, other body = %d %s, want 422 naming Idempotency-Key", other.status, other.body)
	}
	// Another key is another order.
	if r := e.postKeyed(t, "retry-2", body); r.status != http.StatusCreated || r.json(t)["id"] == id {
		t.Fatalf("another key = %d %s, want a new order", r.status, r.body)
	}
	if o, _, m := e.counts(t); o != 2 || m != 2 {
		t.Fatalf("%d orders, %d outbox rows; want 2 and 2", o, m)
	}
}

// TestIdempotencyKeyConcurrent: concurrent POSTs with one key and body
// create one order and one OrderPlaced; every one of them answers with it.
func TestIdempotencyKeyConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	body := orderBody("EUR", itemJSON(bookA, "1", `"9.99"`))
	const n = 12
	for round := range 3 {
		key := "concurrent-" + string(rune('a'+round))
		results := make([]response, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				results[i] = e.postKeyed(t, key, body)
			})
		}
		close(start)
		wg.Wait()
		ids := map[any]int{}
		for _, r := range results {
			if r.status != http.StatusCreated {
				t.Fatalf("POST = %d %s, want 201", r.status, r.body)
			}
			ids[r.json(t)["id"]]++
		}
		if len(ids) != 1 {
			t.Fatalf("round %d: %d different orders for one key: %v", round, len(ids), ids)
		}
	}
	if o, _, _ := e.counts(t); o != 3 || e.placedCount(t) != 3 {
		t.Fatalf("%d orders, %d OrderPlaced; want 3 and 3", o, e.placedCount(t))
	}
}

// TestIdempotencyKeyMalformed: a key that is empty, too long or not
// printable ASCII is refused with 400 and writes nothing.
func TestIdempotencyKeyMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	body := orderBody("EUR", itemJSON(bookA, "1", `"1"`))
	for _, key := range []string{"", strings.Repeat("k", 256), "naïve", "has space", "tab\tkey"} {
		r := e.postKeyed(t, key, body)
		if r.status != http.StatusBadRequest || !strings.Contains(r.errorMessage(t), "Idempotency-Key") {
			t.Errorf("key %q = %d %s, want 400 naming Idempotency-Key", key, r.status, r.body)
		}
	}
	if o, i, m := e.counts(t); o != 0 || i != 0 || m != 0 {
		t.Fatalf("malformed keys wrote %d orders, %d items, %d outbox rows", o, i, m)
	}
}

// ageKey makes key look older than the default TTL (24h).
func (e *env) ageKey(tb testing.TB, key string) {
	tb.Helper()
	tag, err := e.pool.Exec(testkit.Context(tb, 30*time.Second),
		`UPDATE order_idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = $1`, key)
	if err != nil || tag.RowsAffected() != 1 {
		tb.Fatalf("age key %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

func (e *env) keyCount(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := e.pool.QueryRow(testkit.Context(tb, 30*time.Second), `SELECT count(*) FROM order_idempotency_keys`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestIdempotencyKeyExpires: a key older than the TTL no longer replays
// (it may be used for a new order), and the cleanup deletes expired keys
// only.
func TestIdempotencyKeyExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	body := orderBody("EUR", itemJSON(bookA, "1", `"3"`))
	first := e.postKeyed(t, "old", body).json(t)["id"]
	e.ageKey(t, "old")
	// Expired: another body is a new order, not a 422.
	r := e.postKeyed(t, "old", orderBody("EUR", itemJSON(bookB, "1", `"3"`)))
	if r.status != http.StatusCreated || r.json(t)["id"] == first {
		t.Fatalf("expired key = %d %s, want a new order", r.status, r.body)
	}
	e.ageKey(t, "old")
	e.postKeyed(t, "fresh", body)
	n, err := e.srv.ExpireKeys(testkit.Context(t, 30*time.Second))
	if err != nil || n != 1 || e.keyCount(t) != 1 {
		t.Fatalf("ExpireKeys = %d, %v; %d keys left; want 1 deleted and 1 left", n, err, e.keyCount(t))
	}
}

// TestRunKeyExpiry: the cleanup loop deletes expired keys on its own and
// returns when its context ends.
func TestRunKeyExpiry(t *testing.T) {
	t.Parallel()
	ob := testkit.NewOutbox(t, testPartitions, 2)
	pool, producer := ob.Pool, ob.Producer
	ctx := testkit.Context(t, 30*time.Second)
	if err := orderapi.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cfg := orderapi.DefaultConfig()
	cfg.KeyExpiryInterval = 20 * time.Millisecond
	srv, err := orderapi.New(cfg, pool, producer, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: srv, pool: pool}
	e.ts = httptest.NewServer(srv)
	defer e.ts.Close()
	e.postKeyed(t, "k", orderBody("EUR", itemJSON(bookA, "1", `"3"`)))
	e.ageKey(t, "k")

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.RunKeyExpiry(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for e.keyCount(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the expired key was never deleted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunKeyExpiry = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RunKeyExpiry did not return after its context ended")
	}
}
