package steady

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// RaceOptions are race's: -orders orders through the classic relay, then
// through Ordo.
type RaceOptions struct {
	measure.Common
	measure.Traffic
	measure.ClassicPolling
	Orders        int // orders, two messages each
	RaceInstances int // classic instances
	RaceNodes     int // Ordo nodes
}

func DefaultRaceOptions() RaceOptions {
	return RaceOptions{Traffic: measure.DefaultTraffic(), ClassicPolling: measure.DefaultClassicPolling(), Orders: 5000, RaceInstances: 2, RaceNodes: 3}
}

func (o *RaceOptions) AddFlags(fs *flag.FlagSet) {
	o.Traffic.AddFlags(fs)
	o.ClassicPolling.AddFlags(fs)
	fs.IntVar(&o.Orders, "orders", o.Orders, "orders (two messages each)")
	fs.IntVar(&o.RaceInstances, "race-instances", o.RaceInstances, "classic relay instances")
	fs.IntVar(&o.RaceNodes, "race-nodes", o.RaceNodes, "Ordo nodes")
}

func (o RaceOptions) Validate() error {
	var errs []error
	if o.Orders < 1 {
		errs = append(errs, fmt.Errorf("orders %d must be positive", o.Orders))
	}
	if o.RaceInstances < 1 || o.RaceInstances > 8 || o.RaceNodes < 1 || o.RaceNodes > 8 {
		errs = append(errs, errors.New("race-instances and race-nodes must be 1..8"))
	}
	return errors.Join(append(errs, o.Traffic.Validate(), o.ClassicPolling.Validate())...)
}

// RunRace is the article's ordering problem made measurable: -orders
// orders (default 5000), each an OrderPlaced and then, in a second
// transaction right after the first commits, an OrderCancelled of the same
// correlation id, committed at -rate orders a second (default 250) while
// the relays run. It counts the orders whose Cancelled arrived before
// their Placed (first deliveries), with the classic relay on
// -race-instances instances (default 2) and then with Ordo on -race-nodes
// nodes (default 3).
func RunRace(ctx context.Context, o RaceOptions, emit func(*result.Result)) error {
	for _, spec := range []measure.SystemSpec{measure.Classic(o.RaceInstances, o.ClassicPolling), measure.Ordo(o.RaceNodes)} {
		res, err := raceOnce(ctx, o, spec)
		if err != nil {
			return fmt.Errorf("%s: %w", spec, err)
		}
		emit(res)
	}
	return nil
}

func raceOnce(ctx context.Context, o RaceOptions, spec measure.SystemSpec) (*result.Result, error) {
	rate := measure.OrDefault(o.Rate, 250)
	r, err := measure.NewRig(ctx, o.Common, "race", int32(o.Workers+2))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New("race")
	res.Label = spec.String()
	spec.AddParams(res)
	res.Param("orders", o.Orders)
	res.Param("orders_per_sec", rate)
	res.Param("workers", o.Workers)
	res.Param("partitions", o.Partitions)

	c, err := measure.StartRigConsumer(ctx, r, false)
	if err != nil {
		return nil, err
	}
	sys, err := spec.Start(ctx, r)
	if err != nil {
		return nil, err
	}
	p, err := measure.NewProducer(measure.ProducerConfig{Rate: rate, Workers: o.Workers, Payload: o.Payload,
		Exchange: r.Exchange, Orders: true, Max: int64(o.Orders)}, r.Pool, o.Partitions)
	if err != nil {
		return nil, err
	}
	fmt.Printf("placing and cancelling %d orders at %d/s through %s\n", o.Orders, rate, spec)
	pctx, cancel := context.WithTimeout(ctx, o.Timeout)
	err = p.Run(pctx) // returns after Max orders, with every transaction finished
	cancel()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, commits, err := measure.Delivered(ctx, r, c, p, sys, res, o.Timeout)
	if err != nil {
		return nil, err
	}

	m := MeasureRace(ids, commits, c.ReceiveTimes())
	ps := p.Stats()
	res.Figure("orders_committed", float64(m.Orders), "")
	res.Figure("reversed", float64(m.Reversed), "")
	res.Figure("reversed_percent", 100*float64(m.Reversed)/float64(max(1, m.Orders)), "%")
	res.Figure("achieved_orders_per_sec", float64(m.Orders)/ps.Elapsed.Seconds(), "orders/s")
	res.Figure("producer_errors", float64(ps.Errors), "")
	if len(m.Gaps) > 0 {
		d := measure.DistributionOf(m.Gaps)
		res.Millis("placed_to_cancelled_commit_p50", d.P50)
	}
	res.Check = c.Report(ids)
	res.Finished = time.Now()
	if m.Reversed > 0 {
		res.Note("%d of %d orders: OrderCancelled arrived before OrderPlaced", m.Reversed, m.Orders)
	}
	return res, nil
}

// raceTimes is what MeasureRace found.
type raceTimes struct {
	Orders   int             // orders with both messages committed
	Reversed int             // of those, Cancelled first received before Placed
	Gaps     []time.Duration // Cancelled's COMMIT returned minus Placed's
}

// MeasureRace pairs each order's OrderPlaced and OrderCancelled by
// correlation id and compares their first receive times. An order with a
// message not received is left to the checker (lost).
func MeasureRace(ids []string, commits map[string]measure.CommitTimes, recv map[string]time.Time) raceTimes {
	type pair struct{ placed, cancelled string }
	orders := map[string]*pair{}
	for _, id := range ids {
		ct := commits[id]
		pr := orders[ct.Key]
		if pr == nil {
			pr = &pair{}
			orders[ct.Key] = pr
		}
		switch ct.Typ {
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
		m.Orders++
		m.Gaps = append(m.Gaps, commits[pr.cancelled].Committed.Sub(commits[pr.placed].Committed))
		tp, okp := recv[pr.placed]
		tc, okc := recv[pr.cancelled]
		if okp && okc && tc.Before(tp) {
			m.Reversed++
		}
	}
	return m
}
