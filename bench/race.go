package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// raceOptions are race's: -orders orders through the classic relay, then
// through Ordo.
type raceOptions struct {
	common
	traffic
	classicPolling
	Orders        int // orders, two messages each
	RaceInstances int // classic instances
	RaceNodes     int // Ordo nodes
}

func defaultRaceOptions() raceOptions {
	return raceOptions{traffic: defaultTraffic(), classicPolling: defaultClassicPolling(), Orders: 5000, RaceInstances: 2, RaceNodes: 3}
}

func (o *raceOptions) addFlags(fs *flag.FlagSet) {
	o.traffic.addFlags(fs)
	o.classicPolling.addFlags(fs)
	fs.IntVar(&o.Orders, "orders", o.Orders, "orders (two messages each)")
	fs.IntVar(&o.RaceInstances, "race-instances", o.RaceInstances, "classic relay instances")
	fs.IntVar(&o.RaceNodes, "race-nodes", o.RaceNodes, "Ordo nodes")
}

func (o raceOptions) validate() error {
	var errs []error
	if o.Orders < 1 {
		errs = append(errs, fmt.Errorf("orders %d must be positive", o.Orders))
	}
	if o.RaceInstances < 1 || o.RaceInstances > 8 || o.RaceNodes < 1 || o.RaceNodes > 8 {
		errs = append(errs, errors.New("race-instances and race-nodes must be 1..8"))
	}
	return errors.Join(append(errs, o.traffic.validate(), o.classicPolling.validate())...)
}

// runRace is the article's ordering problem made measurable: -orders
// orders (default 5000), each an OrderPlaced and then, in a second
// transaction right after the first commits, an OrderCancelled of the same
// correlation id, committed at -rate orders a second (default 250) while
// the relays run. It counts the orders whose Cancelled arrived before
// their Placed (first deliveries), with the classic relay on
// -race-instances instances (default 2) and then with Ordo on -race-nodes
// nodes (default 3).
func runRace(ctx context.Context, o raceOptions, emit func(*result.Result)) error {
	for _, spec := range []systemSpec{classic(o.RaceInstances, o.classicPolling), ordo(o.RaceNodes)} {
		res, err := raceOnce(ctx, o, spec)
		if err != nil {
			return fmt.Errorf("%s: %w", spec, err)
		}
		emit(res)
	}
	return nil
}

func raceOnce(ctx context.Context, o raceOptions, spec systemSpec) (*result.Result, error) {
	rate := orDefault(o.Rate, 250)
	r, err := newRig(ctx, o.common, "race", int32(o.Workers+2))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New("race")
	res.Label = spec.String()
	spec.addParams(res)
	res.Param("orders", o.Orders)
	res.Param("orders_per_sec", rate)
	res.Param("workers", o.Workers)
	res.Param("partitions", o.Partitions)

	c, err := startRigConsumer(ctx, r, false)
	if err != nil {
		return nil, err
	}
	sys, err := spec.start(ctx, r)
	if err != nil {
		return nil, err
	}
	p, err := newProducer(producerConfig{Rate: rate, Workers: o.Workers, Payload: o.Payload,
		Exchange: r.Exchange, Orders: true, Max: int64(o.Orders)}, r.Pool, o.Partitions)
	if err != nil {
		return nil, err
	}
	fmt.Printf("placing and cancelling %d orders at %d/s through %s\n", o.Orders, rate, spec)
	pctx, cancel := context.WithTimeout(ctx, o.Timeout)
	err = p.run(pctx) // returns after Max orders, with every transaction finished
	cancel()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, commits := p.snapshot()
	if err := c.waitAll(ctx, ids, o.Timeout, sys.failed); err != nil {
		return nil, err
	}
	if _, err := r.WaitPending(ctx, sys.failed, nil); err != nil {
		return nil, err
	}
	if err := sys.stop(); err != nil {
		return nil, err
	}
	if cs, ok := sys.(*classicSystem); ok {
		cs.addTo(res)
	}

	m := measureRace(ids, commits, c.receiveTimes())
	ps := p.stats()
	res.Figure("orders_committed", float64(m.orders), "")
	res.Figure("reversed", float64(m.reversed), "")
	res.Figure("reversed_percent", 100*float64(m.reversed)/float64(max(1, m.orders)), "%")
	res.Figure("achieved_orders_per_sec", float64(m.orders)/ps.elapsed.Seconds(), "orders/s")
	res.Figure("producer_errors", float64(ps.errors), "")
	if len(m.gaps) > 0 {
		d := distributionOf(m.gaps)
		res.Millis("placed_to_cancelled_commit_p50", d.p50)
	}
	res.Check = c.report(ids)
	res.Finished = time.Now()
	if m.reversed > 0 {
		res.Note("%d of %d orders: OrderCancelled arrived before OrderPlaced", m.reversed, m.orders)
	}
	return res, nil
}

// raceTimes is what measureRace found.
type raceTimes struct {
	orders   int             // orders with both messages committed
	reversed int             // of those, Cancelled first received before Placed
	gaps     []time.Duration // Cancelled's COMMIT returned minus Placed's
}

// measureRace pairs each order's OrderPlaced and OrderCancelled by
// correlation id and compares their first receive times. An order with a
// message not received is left to the checker (lost).
func measureRace(ids []string, commits map[string]commitTimes, recv map[string]time.Time) raceTimes {
	type pair struct{ placed, cancelled string }
	orders := map[string]*pair{}
	for _, id := range ids {
		ct := commits[id]
		pr := orders[ct.key]
		if pr == nil {
			pr = &pair{}
			orders[ct.key] = pr
		}
		switch ct.typ {
		case "OrderPlaced":
			pr.placed = id
		case "OrderCancelled":
			pr.cancelled = id
		}
	}
	var m raceTimes
	for _, pr := range orders {
		if pr.placed == "" || pr.cancelled == "" {
			continue
		}
		m.orders++
		m.gaps = append(m.gaps, commits[pr.cancelled].committed.Sub(commits[pr.placed].committed))
		tp, okp := recv[pr.placed]
		tc, okc := recv[pr.cancelled]
		if okp && okc && tc.Before(tp) {
			m.reversed++
		}
	}
	return m
}
