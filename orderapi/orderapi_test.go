package orderapi_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/orderapi"
)

func TestPlaceGetCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	body := orderBody("EUR", itemJSON(bookA, "2", `"12.50"`), itemJSON(bookB, "1", `3.1`))
	r := e.do(t, http.MethodPost, "/orders", "application/json; charset=utf-8", body,
		http.Header{"Traceparent": {tp}})
	if r.status != http.StatusCreated {
		t.Fatalf("POST /orders = %d %s, want 201", r.status, r.body)
	}
	placed := r.json(t)
	id, _ := placed["id"].(string)
	if placed["total"] != "28.10" {
		t.Errorf("total = %v, want \"28.10\"", placed["total"])
	}
	oid, err := uuid.Parse(id)
	if err != nil || oid.Version() != 7 {
		t.Fatalf("id %q is not a UUIDv7 (%v)", id, err)
	}
	if loc := r.header.Get("Location"); loc != "/orders/"+id {
		t.Errorf("Location = %q, want /orders/%s", loc, id)
	}

	got := e.get(t, "/orders/"+id)
	if got.status != http.StatusOK {
		t.Fatalf("GET = %d %s", got.status, got.body)
	}
	o := got.json(t)
	for k, want := range map[string]any{"id": id, "customerId": customerID, "currency": "EUR", "total": "28.10", "status": "placed"} {
		if o[k] != want {
			t.Errorf("GET %s = %v, want %v", k, o[k], want)
		}
	}
	if _, ok := o["cancelledAt"]; ok {
		t.Errorf("GET of a placed order has cancelledAt: %s", got.body)
	}
	if s, _ := o["placedAt"].(string); !parsesRFC3339(s) {
		t.Errorf("placedAt = %q, not RFC 3339", s)
	}
	wantItems := `[{"bookId":"` + bookA + `","quantity":2,"unitPrice":"12.50"},{"bookId":"` + bookB + `","quantity":1,"unitPrice":"3.10"}]`
	if items := compactJSON(t, o["items"]); items != wantItems {
		t.Errorf("GET items = %s, want %s", items, wantItems)
	}

	msgs := e.messages(t, id)
	if len(msgs) != 1 {
		t.Fatalf("outbox holds %d rows for the order, want 1", len(msgs))
	}
	m := msgs[0]
	if m.exchange != e.exchange || m.routingKey != "order.placed" || m.typ != "bookstore.order-placed.v1" ||
		m.correlationID != id || m.keySeq != 1 {
		t.Errorf("OrderPlaced row = %+v, want exchange %s, order.placed, bookstore.order-placed.v1, correlation %s, key_seq 1",
			m, e.exchange, id)
	}
	for k, want := range map[string]any{"orderId": id, "customerId": customerID, "currency": "EUR", "total": "28.10"} {
		if m.payload[k] != want {
			t.Errorf("payload %s = %v, want %v", k, m.payload[k], want)
		}
	}
	if s, _ := m.payload["placedAt"].(string); s != o["placedAt"] || !parsesRFC3339(s) {
		t.Errorf("payload placedAt = %q, want %v", s, o["placedAt"])
	}
	if items := compactJSON(t, m.payload["items"]); items != wantItems {
		t.Errorf("payload items = %s, want %s", items, wantItems)
	}
	if m.headers["traceparent"] != tp {
		t.Errorf("headers = %v, want traceparent %s", m.headers, tp)
	}

	c := e.post(t, "/orders/"+id+"/cancel", "")
	if c.status != http.StatusOK {
		t.Fatalf("cancel = %d %s, want 200", c.status, c.body)
	}
	if cm := c.json(t); cm["id"] != id || cm["status"] != "cancelled" {
		t.Errorf("cancel answered %s", c.body)
	}
	o = e.get(t, "/orders/"+id).json(t)
	if o["status"] != "cancelled" || !parsesRFC3339(fmt.Sprint(o["cancelledAt"])) {
		t.Errorf("after cancel GET = %v", o)
	}
	msgs = e.messages(t, id)
	if len(msgs) != 2 {
		t.Fatalf("outbox holds %d rows for the order, want 2", len(msgs))
	}
	m = msgs[1]
	if m.exchange != e.exchange || m.routingKey != "order.cancelled" || m.typ != "bookstore.order-cancelled.v1" ||
		m.correlationID != id || m.keySeq != 2 {
		t.Errorf("OrderCancelled row = %+v", m)
	}
	if m.payload["orderId"] != id || m.payload["cancelledAt"] != o["cancelledAt"] || len(m.payload) != 2 {
		t.Errorf("OrderCancelled payload = %v, want orderId %s and cancelledAt %v", m.payload, id, o["cancelledAt"])
	}

	again := e.post(t, "/orders/"+id+"/cancel", "")
	if again.status != http.StatusConflict {
		t.Errorf("second cancel = %d %s, want 409", again.status, again.body)
	}
	if msg := again.errorMessage(t); !strings.Contains(msg, "already cancelled") {
		t.Errorf("second cancel error = %q", msg)
	}
	if n := len(e.messages(t, id)); n != 2 {
		t.Errorf("outbox holds %d rows after the refused cancel, want 2", n)
	}
}

func TestTotalsUseMinorUnits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name      string
		body      string
		wantTotal string
	}{
		{"JPY has no minor unit", orderBody("JPY", itemJSON(bookA, "3", `"500"`)), "1500"},
		{"JPY number price", orderBody("JPY", itemJSON(bookA, "2", `250`), itemJSON(bookB, "1", `1000`)), "1500"},
		{"KWD has three digits", orderBody("KWD", itemJSON(bookA, "5", `"0.25"`)), "1.250"},
		{"BHD number price", orderBody("BHD", itemJSON(bookA, "1", `1.005`), itemJSON(bookB, "2", `"0.001"`)), "1.007"},
		{"CLF has four digits", orderBody("CLF", itemJSON(bookA, "1", `"0.0001"`)), "0.0001"},
		{"EUR whole price", orderBody("EUR", itemJSON(bookA, "10000", `"99"`)), "990000.00"},
		{"EUR free book", orderBody("EUR", itemJSON(bookA, "1", `"0"`)), "0.00"},
		{"EUR leading zeros", orderBody("EUR", itemJSON(bookA, "1", `"007.5"`)), "7.50"},
		{"EUR exactly the limit", orderBody("EUR", itemJSON(bookA, "1", `"1000000000000.00"`)), "1000000000000.00"},
		{"EUR no float rounding", orderBody("EUR", itemJSON(bookA, "3", `0.10`), itemJSON(bookB, "7", `0.70`)), "5.20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, total := e.place(t, tc.body)
			if total != tc.wantTotal {
				t.Errorf("POST total = %q, want %q", total, tc.wantTotal)
			}
			o := e.get(t, "/orders/"+id).json(t)
			if o["total"] != tc.wantTotal {
				t.Errorf("GET total = %v, want %q", o["total"], tc.wantTotal)
			}
			msgs := e.messages(t, id)
			if len(msgs) != 1 || msgs[0].payload["total"] != tc.wantTotal {
				t.Errorf("OrderPlaced = %+v, want total %q", msgs, tc.wantTotal)
			}
		})
	}
}

func TestTraceparent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name, header string
		copied       bool
	}{
		{"valid", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", true},
		{"upper-case hex", "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", false},
		{"version ff (invalid)", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{"short trace id", "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01", false},
		{"zero trace id", "00-00000000000000000000000000000000-b7ad6b7169203331-01", false},
		{"zero parent id", "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", false},
		{"trailing data", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", false},
		{"absent", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.header != "" {
				h.Set("traceparent", tc.header)
			}
			r := e.do(t, http.MethodPost, "/orders", "application/json", orderBody("EUR", itemJSON(bookA, "1", `"1"`)), h)
			if r.status != http.StatusCreated {
				t.Fatalf("POST = %d %s", r.status, r.body)
			}
			id := r.json(t)["id"].(string)
			c := e.do(t, http.MethodPost, "/orders/"+id+"/cancel", "", "", h)
			if c.status != http.StatusOK {
				t.Fatalf("cancel = %d %s", c.status, c.body)
			}
			for _, m := range e.messages(t, id) {
				got, ok := m.headers["traceparent"]
				if tc.copied && got != tc.header {
					t.Errorf("%s headers = %v, want traceparent %s", m.typ, m.headers, tc.header)
				}
				if !tc.copied && (ok || len(m.headers) != 0) {
					t.Errorf("%s headers = %v, want none", m.typ, m.headers)
				}
			}
		})
	}
}

// failCommits makes every later COMMIT of a transaction that inserted into
// the outbox fail, after all its statements succeeded.
func failCommits(t *testing.T, e *env) {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	_, err := e.pool.Exec(ctx, `
		CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'commit refused by the test';
		END
		$$;
		CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON outbox
			DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION fail_commit();`)
	if err != nil {
		t.Fatalf("install failing commit trigger: %v", err)
	}
}

func TestPlaceIsAtomicWhenCommitFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	failCommits(t, e)
	r := e.post(t, "/orders", orderBody("EUR", itemJSON(bookA, "2", `"12.50"`)))
	if r.status != http.StatusInternalServerError {
		t.Fatalf("POST with a failing commit = %d %s, want 500", r.status, r.body)
	}
	if msg := r.errorMessage(t); msg != "internal error" {
		t.Errorf("500 error = %q, want \"internal error\" (the cause is logged, not sent)", msg)
	}
	if o, i, m := e.counts(t); o != 0 || i != 0 || m != 0 {
		t.Errorf("after a failed commit: %d orders, %d items, %d outbox rows; want none", o, i, m)
	}
}

// TestPlaceIsAtomicWhenTheEventIsRefused: the order's statements reach
// the database together, the event's INSERT last; when the database
// refuses it, the order and its items are not written either, with an
// Idempotency-Key (the caller's transaction) or without (the batch's
// implicit transaction), and the key stays free.
func TestPlaceIsAtomicWhenTheEventIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := testkit.Context(t, 30*time.Second)
	_, err := e.pool.Exec(ctx, `
		CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'event refused by the test';
		END
		$$;
		CREATE TRIGGER refuse_event BEFORE INSERT ON outbox
			FOR EACH ROW EXECUTE FUNCTION refuse_event();`)
	if err != nil {
		t.Fatalf("install refusing trigger: %v", err)
	}
	body := orderBody("EUR", itemJSON(bookA, "2", `"12.50"`))
	for _, h := range []http.Header{nil, {"Idempotency-Key": {"refused-once"}}} {
		r := e.do(t, http.MethodPost, "/orders", "application/json", body, h)
		if r.status != http.StatusInternalServerError {
			t.Fatalf("POST (headers %v) with the event refused = %d %s, want 500", h, r.status, r.body)
		}
		if o, i, m := e.counts(t); o != 0 || i != 0 || m != 0 {
			t.Fatalf("after a refused event (headers %v): %d orders, %d items, %d outbox rows; want none", h, o, i, m)
		}
	}
	if _, err := e.pool.Exec(ctx, `DROP TRIGGER refuse_event ON outbox`); err != nil {
		t.Fatal(err)
	}
	r := e.do(t, http.MethodPost, "/orders", "application/json", body, http.Header{"Idempotency-Key": {"refused-once"}})
	if r.status != http.StatusCreated {
		t.Fatalf("POST with the key of a refused request = %d %s, want 201", r.status, r.body)
	}
	if o, i, m := e.counts(t); o != 1 || i != 1 || m != 1 {
		t.Errorf("after the retry: %d orders, %d items, %d outbox rows; want 1 each", o, i, m)
	}
}

func TestCancelIsAtomicWhenCommitFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id, _ := e.place(t, orderBody("EUR", itemJSON(bookA, "1", `"5"`)))
	failCommits(t, e)
	r := e.post(t, "/orders/"+id+"/cancel", "")
	if r.status != http.StatusInternalServerError {
		t.Fatalf("cancel with a failing commit = %d %s, want 500", r.status, r.body)
	}
	if msg := r.errorMessage(t); msg != "internal error" {
		t.Errorf("500 error = %q", msg)
	}
	if o := e.get(t, "/orders/"+id).json(t); o["status"] != "placed" {
		t.Errorf("status after a failed cancel = %v, want placed", o["status"])
	}
	msgs := e.messages(t, id)
	if len(msgs) != 1 || msgs[0].typ != orderapi.TypeOrderPlaced {
		t.Errorf("outbox after a failed cancel = %+v, want only OrderPlaced", msgs)
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	good := orderBody("EUR", itemJSON(bookA, "2", `"12.50"`))
	withItem := func(quantity, price string) string {
		return orderBody("EUR", itemJSON(bookA, quantity, price))
	}
	manyItems := make([]string, 1001)
	for i := range manyItems {
		manyItems[i] = itemJSON(bookA, "1", `"1"`)
	}
	json := "application/json"
	for _, tc := range []struct {
		name, method, path, contentType, body string
		status                                int
		want                                  string // in the error message
	}{
		{"malformed JSON", "POST", "/orders", json, `{"customerId": `, 400, "malformed JSON"},
		{"not JSON", "POST", "/orders", json, `customerId=1`, 400, "malformed JSON"},
		{"empty body", "POST", "/orders", json, ``, 400, "empty"},
		{"array body", "POST", "/orders", json, `[]`, 400, "object"},
		{"trailing object", "POST", "/orders", json, good + ` {}`, 400, "after the JSON"},
		{"trailing garbage", "POST", "/orders", json, good + `x`, 400, "after the JSON"},
		{"unknown field", "POST", "/orders", json, `{"coupon":"FREE",` + good[1:], 400, `"coupon"`},
		{"unknown item field", "POST", "/orders", json, orderBody("EUR", `{"bookId":"`+bookA+`","quantity":1,"unitPrice":"1","discount":1}`), 400, `"discount"`},
		{"field name in another case", "POST", "/orders", json, strings.Replace(good, `"customerId"`, `"CustomerID"`, 1), 400, `unknown field "CustomerID"`},
		{"field name in lower case", "POST", "/orders", json, strings.Replace(good, `"customerId"`, `"customerid"`, 1), 400, `unknown field "customerid"`},
		{"item field name in another case", "POST", "/orders", json, strings.Replace(good, `"unitPrice"`, `"UnitPrice"`, 1), 400, `items[0]: unknown field "UnitPrice"`},
		{"field name twice in two cases", "POST", "/orders", json, `{"Currency":"USD",` + good[1:], 400, `unknown field "Currency"`},
		{"missing currency", "POST", "/orders", json, `{"customerId":"` + customerID + `","items":[` + itemJSON(bookA, "1", `"1"`) + `]}`, 400, "currency"},
		{"unknown currency", "POST", "/orders", json, orderBody("XXY", itemJSON(bookA, "1", `"1"`)), 400, "currency"},
		{"lower-case currency", "POST", "/orders", json, orderBody("eur", itemJSON(bookA, "1", `"1"`)), 400, "currency"},
		{"four-letter currency", "POST", "/orders", json, orderBody("EURO", itemJSON(bookA, "1", `"1"`)), 400, "currency"},
		{"numeric currency", "POST", "/orders", json, `{"customerId":"` + customerID + `","currency":978,"items":[]}`, 400, "currency"},
		{"empty items", "POST", "/orders", json, orderBody("EUR"), 400, "items"},
		{"missing items", "POST", "/orders", json, `{"customerId":"` + customerID + `","currency":"EUR"}`, 400, "items"},
		{"too many items", "POST", "/orders", json, orderBody("EUR", manyItems...), 400, "items"},
		{"quantity 0", "POST", "/orders", json, withItem("0", `"1"`), 400, "items[0].quantity"},
		{"quantity 10001", "POST", "/orders", json, withItem("10001", `"1"`), 400, "items[0].quantity"},
		{"quantity negative", "POST", "/orders", json, withItem("-1", `"1"`), 400, "items[0].quantity"},
		{"quantity 1.5", "POST", "/orders", json, withItem("1.5", `"1"`), 400, "items[0].quantity"},
		{"quantity 1e2", "POST", "/orders", json, withItem("1e2", `"1"`), 400, "items[0].quantity"},
		{"quantity string", "POST", "/orders", json, withItem(`"2"`, `"1"`), 400, "items[0].quantity"},
		{"quantity null", "POST", "/orders", json, withItem(`null`, `"1"`), 400, "items[0].quantity"},
		{"quantity huge", "POST", "/orders", json, withItem(`99999999999999999999999`, `"1"`), 400, "items[0].quantity"},
		{"negative price string", "POST", "/orders", json, withItem("1", `"-1"`), 400, "items[0].unitPrice: negative price"},
		{"negative price number", "POST", "/orders", json, withItem("1", `-1`), 400, "items[0].unitPrice: negative price"},
		{"exponent price string", "POST", "/orders", json, withItem("1", `"1e3"`), 400, "items[0].unitPrice"},
		{"exponent price number", "POST", "/orders", json, withItem("1", `1e3`), 400, "items[0].unitPrice"},
		{"plus sign price", "POST", "/orders", json, withItem("1", `"+1"`), 400, "items[0].unitPrice"},
		{"hex price", "POST", "/orders", json, withItem("1", `"0x10"`), 400, "items[0].unitPrice"},
		{"bare fraction price", "POST", "/orders", json, withItem("1", `".5"`), 400, "items[0].unitPrice"},
		{"trailing dot price", "POST", "/orders", json, withItem("1", `"5."`), 400, "items[0].unitPrice"},
		{"spaced price", "POST", "/orders", json, withItem("1", `" 5"`), 400, "items[0].unitPrice"},
		{"bool price", "POST", "/orders", json, withItem("1", `true`), 400, "items[0].unitPrice"},
		{"missing price", "POST", "/orders", json, orderBody("EUR", `{"bookId":"`+bookA+`","quantity":1}`), 400, "items[0].unitPrice"},
		{"too many decimals EUR", "POST", "/orders", json, withItem("1", `"12.505"`), 400, "items[0].unitPrice: has 3 decimal places, EUR allows 2"},
		{"too many decimals EUR number", "POST", "/orders", json, withItem("1", `12.500`), 400, "items[0].unitPrice: has 3 decimal places, EUR allows 2"},
		{"decimals JPY", "POST", "/orders", json, orderBody("JPY", itemJSON(bookA, "1", `"100.5"`)), 400, "items[0].unitPrice: has 1 decimal place, JPY allows 0"},
		{"non-UUID customerId", "POST", "/orders", json, strings.Replace(good, customerID, "customer-42", 1), 400, "customerId"},
		{"unhyphenated customerId", "POST", "/orders", json, strings.Replace(good, customerID, strings.ReplaceAll(customerID, "-", ""), 1), 400, "customerId"},
		{"numeric customerId", "POST", "/orders", json, `{"customerId":5,"currency":"EUR","items":[` + itemJSON(bookA, "1", `"1"`) + `]}`, 400, "customerId"},
		{"missing customerId", "POST", "/orders", json, `{"currency":"EUR","items":[` + itemJSON(bookA, "1", `"1"`) + `]}`, 400, "customerId"},
		{"non-UUID bookId", "POST", "/orders", json, orderBody("EUR", itemJSON(bookA, "1", `"1"`), itemJSON("book-7", "1", `"1"`)), 400, "items[1].bookId"},
		{"total over 10^12", "POST", "/orders", json, orderBody("EUR", itemJSON(bookA, "10000", `"99999999.99"`), itemJSON(bookB, "1", `"200000000"`)), 400, "total"},
		{"price over 10^12", "POST", "/orders", json, withItem("1", `"`+strings.Repeat("9", 5000)+`"`), 400, "items[0].unitPrice"},
		{"body over 1 MiB", "POST", "/orders", json, `{"customerId":"` + strings.Repeat("a", 1<<20) + `"}`, 413, "limit"},
		{"wrong content type", "POST", "/orders", "text/plain", good, 415, "Content-Type"},
		{"form content type", "POST", "/orders", "application/x-www-form-urlencoded", good, 415, "Content-Type"},
		{"no content type", "POST", "/orders", "", good, 415, "Content-Type"},
		{"malformed content type", "POST", "/orders", "application/json; charset", good, 415, "Content-Type"},
		{"GET non-UUID id", "GET", "/orders/not-a-uuid", "", "", 400, "id"},
		{"cancel non-UUID id", "POST", "/orders/not-a-uuid/cancel", "", "", 400, "id"},
		{"wrong method", "DELETE", "/orders", "", "", 405, "DELETE"},
		{"unknown path", "GET", "/books", "", "", 404, "/books"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, tc.method, tc.path, tc.contentType, tc.body, nil)
			if r.status != tc.status {
				t.Errorf("status = %d, want %d (body %.200s)", r.status, tc.status, r.body)
			}
			if msg := r.errorMessage(t); !strings.Contains(msg, tc.want) {
				t.Errorf("error = %q, want it to mention %q", msg, tc.want)
			}
			if o, i, m := e.counts(t); o != 0 || i != 0 || m != 0 {
				t.Fatalf("bad input wrote %d orders, %d items, %d outbox rows", o, i, m)
			}
		})
	}
}

func TestWrongMethodListsAllowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	r := e.do(t, http.MethodPut, "/orders/"+uuid.NewString(), "", "", nil)
	if r.status != http.StatusMethodNotAllowed {
		t.Fatalf("PUT = %d, want 405", r.status)
	}
	if allow := r.header.Get("Allow"); !strings.Contains(allow, "GET") {
		t.Errorf("Allow = %q, want GET", allow)
	}
	r.errorMessage(t)
	if h := e.get(t, "/healthz"); h.status != http.StatusOK {
		t.Errorf("GET /healthz = %d %s", h.status, h.body)
	}
}

func TestConcurrentCancelsCancelOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id, _ := e.place(t, orderBody("EUR", itemJSON(bookA, "1", `"9.99"`)))
	const n = 10
	statuses := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			resp, err := e.ts.Client().Post(e.ts.URL+"/orders/"+id+"/cancel", "", nil)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("cancel: %v", err)
		}
	}
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[http.StatusOK] != 1 || count[http.StatusConflict] != n-1 {
		t.Errorf("cancel statuses = %v, want one 200 and %d 409", count, n-1)
	}
	cancelled := 0
	for _, m := range e.messages(t, id) {
		if m.typ == orderapi.TypeOrderCancelled {
			cancelled++
		}
	}
	if cancelled != 1 {
		t.Errorf("%d OrderCancelled rows, want 1", cancelled)
	}
}

func TestUnknownOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := uuid.NewString()
	for _, r := range []response{e.post(t, "/orders/"+id+"/cancel", ""), e.get(t, "/orders/"+id)} {
		if r.status != http.StatusNotFound {
			t.Errorf("status = %d %s, want 404", r.status, r.body)
		}
		if msg := r.errorMessage(t); !strings.Contains(msg, id) {
			t.Errorf("error = %q, want the id", msg)
		}
	}
	if o, i, m := e.counts(t); o != 0 || i != 0 || m != 0 {
		t.Errorf("unknown order wrote %d orders, %d items, %d outbox rows", o, i, m)
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = orderapi.Migrate(ctx, pool) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if err := orderapi.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var versions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ordo_schema_migrations WHERE component = 'orderapi'`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migration files: %v %v", files, err)
	}
	if versions != len(files) {
		t.Errorf("%d orderapi migrations recorded, want %d (one per file)", versions, len(files))
	}
}

func TestConfig(t *testing.T) {
	if err := orderapi.DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig is invalid: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*orderapi.Config)
	}{
		{"long exchange", func(c *orderapi.Config) { c.Exchange = strings.Repeat("x", 256) }},
		{"NUL in exchange", func(c *orderapi.Config) { c.Exchange = "a\x00b" }},
		{"tiny body limit", func(c *orderapi.Config) { c.MaxBodyBytes = 10 }},
		{"no items", func(c *orderapi.Config) { c.MaxItems = 0 }},
		{"short key TTL", func(c *orderapi.Config) { c.IdempotencyKeyTTL = time.Second }},
		{"no expiry interval", func(c *orderapi.Config) { c.KeyExpiryInterval = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := orderapi.DefaultConfig()
			tc.edit(&c)
			if err := c.Validate(); err == nil {
				t.Errorf("Validate accepted %+v", c)
			}
			if _, err := orderapi.New(c, nil, nil, nil); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
	if _, err := orderapi.New(orderapi.DefaultConfig(), nil, nil, nil); err == nil {
		t.Error("New accepted a nil pool and producer")
	}
}

func parsesRFC3339(s string) bool {
	_, err := time.Parse(time.RFC3339Nano, s)
	return err == nil
}
