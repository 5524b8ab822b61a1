package steady

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/orderapi"
)

// OrdersOptions are orders': orders placed through the order API at
// -rate a second for -duration.
type OrdersOptions struct {
	measure.Common
	Rate     int           // orders a second (0: 200)
	Workers  int           // concurrent HTTP clients
	Duration time.Duration // how long orders are placed
	Warmup   time.Duration // orders placed in this first part are not measured
	APIConns int           // the order API's pool (ORDO_DB_MAX_CONNS)
	Lean     bool          // the producers' key_seq trigger dropped once the node runs
}

func DefaultOrdersOptions() OrdersOptions {
	return OrdersOptions{Workers: 32, Duration: 15 * time.Second, Warmup: 2 * time.Second, APIConns: 8}
}

func (o *OrdersOptions) AddFlags(fs *flag.FlagSet) {
	measure.RateVar(fs, &o.Rate)
	fs.IntVar(&o.Workers, "orders-workers", o.Workers, "concurrent HTTP clients placing orders")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long orders are placed")
	WarmupVar(fs, &o.Warmup)
	fs.IntVar(&o.APIConns, "orders-api-conns", o.APIConns, "the order API's PostgreSQL pool (ORDO_DB_MAX_CONNS)")
	fs.BoolVar(&o.Lean, "lean", o.Lean, "drop the producers' key_seq trigger once the node runs (outbox.DropKeySeqTrigger): the order API's rows arrive without key_seq and the partition owner numbers them")
}

func (o OrdersOptions) Validate() error {
	var errs []error
	if o.Duration <= 0 || o.Warmup < 0 || o.Warmup >= o.Duration {
		errs = append(errs, fmt.Errorf("duration %v must be positive and warmup %v shorter", o.Duration, o.Warmup))
	}
	if o.Workers < 1 || o.Workers > 256 {
		errs = append(errs, fmt.Errorf("orders-workers %d out of range 1..256", o.Workers))
	}
	if o.APIConns < 1 || o.APIConns > 64 {
		errs = append(errs, fmt.Errorf("orders-api-conns %d out of range 1..64", o.APIConns))
	}
	return errors.Join(append(errs, measure.CheckRate(o.Rate))...)
}

// placedOrder is one order the scenario placed: when its request was
// sent, when the order API answered 201, and the order's id.
type placedOrder struct {
	sent, created time.Time
	id            string
}

// RunOrders places orders through the order API (cmd/orderapi: the
// order row and its OrderPlaced outbox row in one transaction) with one
// Ordo node relaying, at -rate a second (default 200) for -duration,
// each order at its due time, sent by -orders-workers clients. It reports the
// rate the API reached, the API's answer time (request to 201) and the
// time from the 201 to the OrderPlaced event's delivery at the bench's
// consumer (the commit is before the 201, so this is at most the
// commit-to-delivery time), and the CPU of every process. Orders placed
// in the first -warmup are not measured; an order that comes due with
// every client busy is not sent, and counted as missed.
func RunOrders(ctx context.Context, o OrdersOptions, emit func(*result.Result)) error {
	rate := measure.OrDefault(o.Rate, 200)
	r, err := measure.NewRig(ctx, o.Common, "orders", 4)
	if err != nil {
		return err
	}
	defer r.Close()
	res := result.New("orders")
	res.Label = fmt.Sprintf("orders-%d", rate)
	res.Param("rate", rate)
	res.Param("workers", o.Workers)
	res.Param("duration", o.Duration)
	res.Param("partitions", o.Partitions)
	res.Param("api_conns", o.APIConns)

	c, err := measure.StartRigConsumer(ctx, r, false)
	if err != nil {
		return err
	}
	node, err := r.StartNode(ctx, "n1", o.AMQPURL)
	if err != nil {
		return err
	}
	if err := node.WaitReady(ctx, o.Timeout); err != nil {
		return err
	}
	if o.Lean {
		res.Param("lean", true)
		if err := measure.DropKeySeqTrigger(ctx, r); err != nil {
			return err
		}
	}
	api, err := r.StartOrderAPI(ctx, "orderapi", r.DBURL, r.Exchange, fmt.Sprintf("ORDO_DB_MAX_CONNS=%d", o.APIConns))
	if err != nil {
		return err
	}
	nodeCPU0, err := node.CPU()
	if err != nil {
		return err
	}
	apiCPU0, err := api.CPU()
	if err != nil {
		return err
	}
	cpu0 := measure.SampleCPU()
	fmt.Printf("placing %d orders a second through the order API for %v\n", rate, o.Duration)
	placed, missed, failed := placeOrders(ctx, "http://"+api.HTTPAddr, rate, o.Workers, o.Duration)
	cpu1 := measure.SampleCPU()
	nodeCPU1, nerr := node.CPU()
	apiCPU1, aerr := api.CPU()
	if err := errors.Join(ctx.Err(), nerr, aerr); err != nil {
		return err
	}
	ids := make([]string, 0, len(placed))
	for _, p := range placed {
		ids = append(ids, p.id)
	}
	err = harness.WaitUntil(ctx, o.Timeout, 20*time.Millisecond, fmt.Sprintf("%d OrderPlaced events", len(ids)), func() (bool, error) {
		if err := errors.Join(c.Failed(), node.Failed(), api.Failed()); err != nil {
			return false, err
		}
		got := deliveredOrders(c)
		for _, id := range ids {
			if _, ok := got[id]; !ok {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	got := deliveredOrders(c)
	from := cpu0.At.Add(o.Warmup)
	var answer, delivery []time.Duration
	for _, p := range placed {
		if p.sent.Before(from) {
			continue
		}
		answer = append(answer, p.created.Sub(p.sent))
		delivery = append(delivery, got[p.id].Sub(p.created))
	}
	window := cpu1.At.Sub(cpu0.At)
	res.Figure("orders", float64(len(placed)), "")
	res.Figure("measured", float64(len(answer)), "")
	res.Figure("achieved_orders_per_sec", float64(len(placed))/window.Seconds(), "orders/s")
	res.Figure("missed", float64(missed), "")
	res.Figure("failed", float64(failed), "")
	measure.DistributionOf(answer).AddTo(res, "api")
	measure.DistributionOf(delivery).AddTo(res, "delivery")
	measure.AddCPU(res, cpu0, cpu1, "")
	res.Seconds("cpu_node", nodeCPU1-nodeCPU0)
	res.Seconds("cpu_orderapi", apiCPU1-apiCPU0)
	if n := len(placed); n > 0 {
		res.Figure("node_us_per_order", float64((nodeCPU1-nodeCPU0).Microseconds())/float64(n), "µs")
		res.Figure("orderapi_us_per_order", float64((apiCPU1-apiCPU0).Microseconds())/float64(n), "µs")
	}
	res.Check = c.Report(nil)
	if missed > 0 {
		res.Note("%d orders came due with every client busy (not sent): the API did not keep up with %d orders a second (or raise -orders-workers)", missed, rate)
	}
	if failed > 0 {
		res.Note("%d orders failed (an error or an answer other than 201)", failed)
	}
	res.Finished = time.Now()
	emit(res)
	return nil
}

// deliveredOrders returns when each order's OrderPlaced event first
// reached the consumer, by order id (the event's correlation id).
func deliveredOrders(c *measure.Consumer) map[string]time.Time {
	out := map[string]time.Time{}
	for _, d := range c.Rec.Deliveries() {
		if d.Type != orderapi.TypeOrderPlaced {
			continue
		}
		if at, ok := out[d.CorrelationID]; !ok || d.Received.Before(at) {
			out[d.CorrelationID] = d.Received
		}
	}
	return out
}

// placeOrders posts rate orders a second for duration, each at its due
// time, through workers concurrent clients, and returns the orders
// the API created, the orders that came due with every client busy (not
// sent), and the requests that failed.
func placeOrders(ctx context.Context, base string, rate, workers int, duration time.Duration) (placed []placedOrder, missed, failed int) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	ticks := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ticks {
				p, err := placeOrder(ctx, client, base)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					placed = append(placed, p)
				}
				mu.Unlock()
			}
		}()
	}
	// Each order is due at its own time from the start: a late wake-up
	// sends the orders that came due meanwhile at once, so the rate
	// asked is the rate offered (a ticker drops the ticks it could not
	// deliver in time, about 5 % at 1,000 a second).
	period := time.Second / time.Duration(rate)
	start := time.Now()
	wait := time.NewTimer(0)
	defer wait.Stop()
	<-wait.C
	for i := time.Duration(0); i*period < duration; i++ {
		if d := time.Until(start.Add(i * period)); d > 0 {
			wait.Reset(d)
			select {
			case <-ctx.Done():
			case <-wait.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case ticks <- struct{}{}:
		default:
			missed++
		}
	}
	close(ticks)
	wg.Wait()
	return placed, missed, failed
}

// placeOrder posts one order of two books and returns it once the API
// answered 201 with its id.
func placeOrder(ctx context.Context, client *http.Client, base string) (placedOrder, error) {
	body, err := json.Marshal(map[string]any{
		"customerId": uuid.NewString(), "currency": "EUR",
		"items": []map[string]any{
			{"bookId": uuid.NewString(), "quantity": 1, "unitPrice": "12.50"},
			{"bookId": uuid.NewString(), "quantity": 2, "unitPrice": "7.99"},
		},
	})
	if err != nil {
		return placedOrder{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", bytes.NewReader(body))
	if err != nil {
		return placedOrder{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	p := placedOrder{sent: time.Now()}
	resp, err := client.Do(req)
	if err != nil {
		return placedOrder{}, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	p.created = time.Now()
	if err != nil {
		return placedOrder{}, err
	}
	if resp.StatusCode != http.StatusCreated {
		return placedOrder{}, fmt.Errorf("POST /orders: %d %s", resp.StatusCode, answer)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(answer, &created); err != nil || created.ID == "" {
		return placedOrder{}, fmt.Errorf("POST /orders: no id in %s", answer)
	}
	p.id = created.ID
	return p, nil
}
