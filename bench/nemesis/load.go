package nemesis

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/orderapi"
)

const (
	// loadRequestTimeout bounds one order API request; a request that
	// times out promised nothing (its order may still arrive).
	loadRequestTimeout = 5 * time.Second
	// loadCancelShare is the share of requests that cancel a recent order.
	loadCancelShare = 0.4
	// loadRecent is how many recent uncancelled orders are kept to cancel.
	loadRecent = 256
	// loadFailPause is how long a worker rests after a failed request, so
	// an outage is not a storm of failing requests (and log lines).
	loadFailPause = 200 * time.Millisecond
)

// loadTarget is one source's order API.
type loadTarget struct {
	source string // the source whose database the API writes to
	addr   string // host:port
}

// order is an order the load placed: its source and id (its correlation
// id).
type order struct{ source, id string }

// orderLoad drives the order APIs (one per source): new orders, each to
// an API drawn at random, and cancels of recent ones, at a steady rate in
// all, remembering every promise (201 for an order, 200 for a cancel).
// Its methods are safe for concurrent use.
type orderLoad struct {
	targets []loadTarget
	client  *http.Client
	rate    int
	workers int

	mu       sync.Mutex
	rng      *rand.Rand
	recent   []order // placed, not cancelled nor taken
	promises []promise
	placed   int
	canceled int
	failed   int // answered, but not 201/200
	errored  int // no answer (timeout, connection refused): outcome unknown
}

func newOrderLoad(targets []loadTarget, rate, workers int, seed int64) *orderLoad {
	return &orderLoad{targets: targets, rate: rate, workers: workers,
		client: &http.Client{Timeout: loadRequestTimeout},
		rng:    rand.New(rand.NewPCG(uint64(seed), 0x6c6f6164))} // "load"
}

// run sends requests at the load's rate from its workers until ctx ends,
// and returns once every worker has.
func (l *orderLoad) run(ctx context.Context) {
	tokens := make(chan struct{}, l.workers)
	var wg sync.WaitGroup
	for range l.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tokens:
				}
				if !l.once(ctx) {
					_ = harness.Sleep(ctx, loadFailPause)
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second / time.Duration(l.rate))
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			select {
			case tokens <- struct{}{}:
			default: // every worker busy: the rate drops rather than bursting later
			}
		}
	}
	wg.Wait()
}

// once places an order or cancels a recent one and reports whether the
// request succeeded.
func (l *orderLoad) once(ctx context.Context) bool {
	l.mu.Lock()
	cancel := len(l.recent) > 0 && l.rng.Float64() < loadCancelShare
	l.mu.Unlock()
	if cancel {
		if o := l.take(); o.id != "" {
			ok, _ := l.cancel(ctx, o)
			return ok
		}
	}
	return l.place(ctx)
}

// place posts one order to an API drawn at random.
func (l *orderLoad) place(ctx context.Context) bool {
	l.mu.Lock()
	qty := 1 + l.rng.IntN(3)
	source := l.targets[l.rng.IntN(len(l.targets))].source
	l.mu.Unlock()
	body, _ := json.Marshal(map[string]any{
		"customerId": uuid.NewString(), "currency": "EUR",
		"items": []map[string]any{{"bookId": uuid.NewString(), "quantity": qty, "unitPrice": "12.50"}},
	})
	var placed struct {
		ID string `json:"id"`
	}
	status, err := l.post(ctx, source, "/orders", body, &placed)
	at := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		l.errored++
		return false
	case status != http.StatusCreated || placed.ID == "":
		l.failed++
		return false
	}
	l.placed++
	l.promises = append(l.promises, promise{Source: source, Key: placed.ID, Type: orderapi.TypeOrderPlaced, At: at})
	l.recent = append(l.recent, order{source, placed.ID})
	if len(l.recent) > loadRecent {
		l.recent = l.recent[1:]
	}
	return true
}

// cancel cancels order o through its source's API and reports whether
// the API answered 200 (a promise of its OrderCancelled).
func (l *orderLoad) cancel(ctx context.Context, o order) (bool, error) {
	status, err := l.post(ctx, o.source, "/orders/"+o.id+"/cancel", nil, nil)
	at := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		l.errored++
		return false, err
	case status != http.StatusOK:
		l.failed++
		return false, fmt.Errorf("cancel %s/%s: %d", o.source, o.id, status)
	}
	l.canceled++
	l.promises = append(l.promises, promise{Source: o.source, Key: o.id, Type: orderapi.TypeOrderCancelled, At: at})
	return true, nil
}

// post sends a JSON POST to source's API and decodes a 2xx answer into
// out (when not nil).
func (l *orderLoad) post(ctx context.Context, source, path string, body []byte, out any) (int, error) {
	base := ""
	for _, t := range l.targets {
		if t.source == source {
			base = "http://" + t.addr
		}
	}
	if base == "" {
		return 0, fmt.Errorf("no order API for source %q", source)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err // the answer did not arrive whole: unknown
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			return 0, fmt.Errorf("decode %s: %w", path, err)
		}
	}
	return resp.StatusCode, nil
}

// take removes a random recent order from the ones the load may cancel,
// and returns it (a zero order when there is none): the nemesis poisons
// its key.
func (l *orderLoad) take() order {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recent) == 0 {
		return order{}
	}
	i := l.rng.IntN(len(l.recent))
	id := l.recent[i]
	l.recent = append(l.recent[:i], l.recent[i+1:]...)
	return id
}

// promise adds a promise made outside the load (the bench's own commits).
func (l *orderLoad) promise(p ...promise) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.promises = append(l.promises, p...)
}

// promisedBefore returns the promises made before t.
func (l *orderLoad) promisedBefore(t time.Time) []promise {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []promise
	for _, p := range l.promises {
		if p.At.Before(t) {
			out = append(out, p)
		}
	}
	return out
}

// all returns every promise.
func (l *orderLoad) all() []promise {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]promise(nil), l.promises...)
}

// loadStats are the load's counts.
type loadStats struct{ placed, canceled, failed, errored int }

func (l *orderLoad) stats() loadStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return loadStats{l.placed, l.canceled, l.failed, l.errored}
}
