package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/node"
)

// httpClient is the demo's HTTP client. Close its idle connections when
// done (CloseIdleConnections), so that no keep-alive goroutine outlives run.
func newHTTPClient() *http.Client {
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second},
	}
}

// exchange performs one request and returns the status and the body,
// compacted when it is JSON.
func exchange(ctx context.Context, client *http.Client, method, url string, body []byte) (int, string, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return 0, "", err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, "", fmt.Errorf("read response of %s %s: %w", method, url, err)
	}
	return resp.StatusCode, compact(b), nil
}

// compact returns b as one line: compacted JSON, or trimmed text.
func compact(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) == nil {
		return buf.String()
	}
	return strings.TrimSpace(string(b))
}

// waitReady polls url until it answers 200, c exits, ctx ends or timeout
// passes.
func waitReady(ctx context.Context, client *http.Client, c *child, url string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		code, body, err := exchange(rctx, client, http.MethodGet, url, nil)
		cancel()
		switch {
		case err == nil && code == http.StatusOK:
			return nil
		case err == nil:
			last = fmt.Sprintf("%d %s", code, body)
		default:
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done():
			return fmt.Errorf("%s exited before it was ready (see its output above): %v", c.name, c.exitError())
		case <-deadline.C:
			return fmt.Errorf("%s not ready within %v: GET %s: %s", c.name, timeout, url, last)
		case <-tick.C:
		}
	}
}

// placedOrder is an order the demo placed.
type placedOrder struct {
	ID        string
	Cancelled bool
}

// newOrder is the body of POST /orders.
type newOrder struct {
	CustomerID string      `json:"customerId"`
	Currency   string      `json:"currency"`
	Items      []orderItem `json:"items"`
}

type orderItem struct {
	BookID    string `json:"bookId"`
	Quantity  int    `json:"quantity"`
	UnitPrice string `json:"unitPrice"`
}

// placeOrders places n orders through the order API at base, then cancels
// every other one (the first, the third, ...), printing each request and
// response.
func placeOrders(ctx context.Context, con *console, client *http.Client, base string, n int) ([]placedOrder, error) {
	prices := []string{"12.50", "7.99", "23.00", "4.25"}
	orders := make([]placedOrder, 0, n)
	for i := range n {
		body, err := json.Marshal(newOrder{
			CustomerID: uuid.NewString(),
			Currency:   "EUR",
			Items: []orderItem{
				{BookID: uuid.NewString(), Quantity: 1 + i%3, UnitPrice: prices[i%len(prices)]},
				{BookID: uuid.NewString(), Quantity: 1, UnitPrice: prices[(i+1)%len(prices)]},
			},
		})
		if err != nil {
			return nil, err
		}
		con.Printf("-> POST /orders %s\n", body)
		code, resp, err := exchange(ctx, client, http.MethodPost, base+"/orders", body)
		if err != nil {
			return nil, fmt.Errorf("place order %d: %w", i+1, err)
		}
		con.Printf("<- %d %s\n", code, resp)
		if code != http.StatusCreated {
			return nil, fmt.Errorf("place order %d: %d %s", i+1, code, resp)
		}
		var created struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(resp), &created); err != nil || created.ID == "" {
			return nil, fmt.Errorf("place order %d: no id in %s", i+1, resp)
		}
		orders = append(orders, placedOrder{ID: created.ID})
	}
	for i := 0; i < len(orders); i += 2 {
		path := "/orders/" + orders[i].ID + "/cancel"
		con.Printf("-> POST %s\n", path)
		code, resp, err := exchange(ctx, client, http.MethodPost, base+path, nil)
		if err != nil {
			return nil, fmt.Errorf("cancel order %s: %w", orders[i].ID, err)
		}
		con.Printf("<- %d %s\n", code, resp)
		if code != http.StatusOK {
			return nil, fmt.Errorf("cancel order %s: %d %s", orders[i].ID, code, resp)
		}
		orders[i].Cancelled = true
	}
	return orders, nil
}

// pending returns the rows waiting in every partition of s, and how many
// partitions its node holds according to the database.
func pending(s node.Status) (pending int64, owned int) {
	for _, p := range s.Leases {
		pending += p.Pending
		if p.Owner == s.Node {
			owned++
		}
	}
	return pending, owned
}

// fetchStatus reads the node's /status, waiting up to wait for its view
// of the leases (refreshed every second) and for the outbox to have
// nothing pending: the node marks rows shortly after the broker confirms
// them, so right after the last delivery a row or two may still count.
func fetchStatus(ctx context.Context, client *http.Client, url string, wait time.Duration) (node.Status, error) {
	deadline := time.Now().Add(wait)
	for {
		var s node.Status
		code, body, err := exchange(ctx, client, http.MethodGet, url, nil)
		if err != nil {
			return s, fmt.Errorf("GET %s: %w", url, err)
		}
		if code != http.StatusOK {
			return s, fmt.Errorf("GET %s: %d %s", url, code, body)
		}
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			return s, fmt.Errorf("GET %s: %w", url, err)
		}
		if p, _ := pending(s); p == 0 && len(s.Leases) > 0 || time.Now().After(deadline) {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
