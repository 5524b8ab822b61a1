package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/outbox"
)

// sqlOwed lists the outbox rows with seq in ($1, $2], the poison orders'
// left out: what the consumers owe.
const sqlOwed = `
SELECT correlation_id, key_seq FROM outbox
WHERE seq > $1 AND seq <= $2 AND NOT starts_with(correlation_id, $3)`

// sqlMissing counts the (key, key_seq) pairs not in the projection, and
// returns when the last of the others was first handled.
const sqlMissing = `
SELECT count(*) FILTER (WHERE h IS NULL), max(h) FROM (
    SELECT (SELECT min(e.handled_at) FROM shipping_events e WHERE e.order_id = u.k AND e.key_seq = u.s) AS h
    FROM unnest($1::text[], $2::bigint[]) AS u(k, s)
) x`

// recovery measures how long after healAt the consumers had handled every
// row committed before the heal and a probe committed on every partition
// right after it.
func (c *consumerRun) recovery(ctx context.Context, step int, healAt time.Time) (time.Duration, error) {
	if err := c.commitProbes(ctx, step); err != nil {
		return 0, err
	}
	upTo, latest, err := c.waitHandled(ctx, recoveryTimeout)
	if err != nil {
		return 0, err
	}
	c.doneSeq = upTo
	return max(latest.Sub(healAt), 0), nil
}

// waitHandled waits until every outbox row committed so far (past
// doneSeq) is handled, and returns the highest seq it covered and when the
// last of them was handled.
func (c *consumerRun) waitHandled(ctx context.Context, timeout time.Duration) (int64, time.Time, error) {
	var upTo int64
	var keys []string
	var seqs []int64
	err := harness.WaitUntil(ctx, harness.SetupTimeout, 100*time.Millisecond, "the outbox to answer", func() (bool, error) {
		keys, seqs = nil, nil
		if err := c.r.Pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM outbox`).Scan(&upTo); err != nil {
			return false, nil // the database restarting
		}
		rows, err := c.r.Pool.Query(ctx, sqlOwed, c.doneSeq, upTo, poisonPrefix)
		if err != nil {
			return false, nil
		}
		var k string
		var s int64
		_, err = pgx.ForEachRow(rows, []any{&k, &s}, func() error { keys, seqs = append(keys, k), append(seqs, s); return nil })
		return err == nil, nil
	})
	if err != nil {
		return 0, time.Time{}, err
	}
	var latest time.Time
	missing := len(keys)
	err = harness.WaitUntil(ctx, timeout, 100*time.Millisecond, fmt.Sprintf("%d committed rows to be handled", len(keys)), func() (bool, error) {
		if err := c.failed(); err != nil {
			return false, err
		}
		var at *time.Time
		if err := c.ship.QueryRow(ctx, sqlMissing, keys, seqs).Scan(&missing, &at); err != nil {
			return false, nil // the database restarting
		}
		if at != nil {
			latest = *at
		}
		return missing == 0, nil
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("%w (%d still missing)", err, missing)
	}
	return upTo, latest, nil
}

// commitProbes commits one message on every partition (the same keys
// every step), retrying until the database takes them.
func (c *consumerRun) commitProbes(ctx context.Context, step int) error {
	msgs := make([]outbox.Message, len(c.probeKeys))
	for p, key := range c.probeKeys {
		msgs[p] = outbox.Message{CorrelationID: key, Exchange: c.exchange, RoutingKey: "order.probe", Type: typeProbe,
			Payload: json.RawMessage(fmt.Sprintf(`{"step":%d}`, step))}
	}
	return harness.WaitUntil(ctx, 30*time.Second, 100*time.Millisecond, "the probes to commit", func() (bool, error) {
		err := pgx.BeginFunc(ctx, c.r.Pool, func(tx pgx.Tx) error {
			_, err := c.producer.Enqueue(ctx, tx, msgs...)
			return err
		})
		return err == nil, nil
	})
}

// finish waits until everything committed is handled, stops the
// instances and the relay, and checks the shipping database.
func (c *consumerRun) finish(ctx context.Context) (consumerVerdict, error) {
	var errs []error
	c.logf("drain: waiting for every committed row to be handled")
	if _, _, err := c.waitHandled(ctx, drainTimeout); err != nil {
		errs = append(errs, fmt.Errorf("drain: %w", err))
	}
	_ = harness.Sleep(ctx, settleAfter)
	if err := c.sh.stopAll(); err != nil {
		errs = append(errs, err)
	}
	if err := c.relay.Stop(); err != nil {
		errs = append(errs, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	committed, handled, st, err := c.readState(rctx)
	if err != nil {
		return consumerVerdict{}, errors.Join(append(errs, err)...)
	}
	c.logf("state: %d rows committed, %d handled, %d dead letters, %d stuck keys", len(committed), len(handled), len(st.Dead), len(st.Stuck))
	return checkConsumers(committed, handled, st, c.poison), errors.Join(errs...)
}

// readState reads the outbox, the projection and the inbox tables.
func (c *consumerRun) readState(ctx context.Context) ([]committedRow, []handledRow, consumerState, error) {
	var st consumerState
	rows, err := c.r.Pool.Query(ctx, `SELECT id::text, correlation_id, key_seq FROM outbox`)
	if err != nil {
		return nil, nil, st, fmt.Errorf("read the outbox: %w", err)
	}
	committed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[committedRow])
	if err != nil {
		return nil, nil, st, fmt.Errorf("read the outbox: %w", err)
	}
	rows, err = c.ship.Query(ctx, `SELECT n, order_id, key_seq, message_id FROM shipping_events`)
	if err != nil {
		return nil, nil, st, fmt.Errorf("read the projection: %w", err)
	}
	handled, err := pgx.CollectRows(rows, pgx.RowToStructByPos[handledRow])
	if err != nil {
		return nil, nil, st, fmt.Errorf("read the projection: %w", err)
	}
	if st.Dead, err = inbox.Dead(ctx, c.ship, c.sh.group); err != nil {
		return nil, nil, st, err
	}
	if st.Stuck, err = inbox.Stuck(ctx, c.ship, c.sh.group, 0); err != nil {
		return nil, nil, st, err
	}
	st.LastSeq = map[string]int64{}
	rows, err = c.ship.Query(ctx, `SELECT correlation_id, last_seq FROM ordo_inbox_keys
		WHERE consumer = $1 AND starts_with(correlation_id, $2)`, c.sh.group, poisonPrefix)
	if err != nil {
		return nil, nil, st, fmt.Errorf("read the poison keys: %w", err)
	}
	var k string
	var s int64
	_, err = pgx.ForEachRow(rows, []any{&k, &s}, func() error { st.LastSeq[k] = s; return nil })
	return committed, handled, st, err
}

// report prints the steps, the recovery by kind and the checker's
// findings, writes the JSON result, and prints the RESULT line last. It
// reports whether the consumers passed.
func (c *consumerRun) report(v consumerVerdict) bool {
	w := os.Stdout
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nstep\tfault\trecovery")
	for _, s := range c.steps {
		rec := "NOT RECOVERED"
		if s.recovered {
			rec = fmt.Sprintf("%.2fs", s.recovery.Seconds())
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", s.N, s.desc, rec)
	}
	_ = tw.Flush()
	byKind, p50, worst := recoveryStats(c.results)
	printRecovery(w, byKind)
	ls := c.load.stats()
	fmt.Fprintf(w, "\nload: %d orders placed, %d cancelled; %d answered otherwise, %d without an answer; %d poison orders planted\n",
		ls.placed, ls.canceled, ls.failed, ls.errored, len(c.poison))
	fmt.Fprintf(w, "consumers: %d rows committed, %d handler commits, %d keys; %d dead letters (%d unexpected), %d stuck keys\n",
		v.Committed, v.Handled, v.Keys, v.Dead, v.UnexpectedDead, v.Stuck)
	for _, p := range v.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
	res := &result.Result{Scenario: "nemesis-consumers", Started: c.start, Finished: time.Now()}
	res.Param("profile", c.o.Profile)
	res.Param("seed", c.seed)
	res.Param("instances", shippingInstances)
	res.Param("shards", shippingShards)
	res.Param("rate", c.o.rateOr(consumerRate))
	res.Param("handler_error_rate", shippingErrorRate)
	res.Param("handler_panic_rate", shippingPanicRate)
	res.Param("max_attempts", shippingMaxAttempts)
	for _, f := range []struct {
		name string
		n    int
	}{{"steps", len(c.steps)}, {"handled_twice", v.HandledTwice}, {"lost", v.Lost}, {"out_of_order", v.OutOfOrder},
		{"dead", v.Dead}, {"unexpected_dead", v.UnexpectedDead}, {"poison_unheld", v.PoisonUnheld}, {"stuck", v.Stuck}} {
		res.Figure(f.name, float64(f.n), "")
	}
	res.Seconds("recovery_p50", p50)
	res.Seconds("recovery_max", worst)
	res.Check = result.Check{Total: v.Handled, Distinct: v.Handled - v.HandledTwice, Duplicates: v.HandledTwice,
		Lost: v.Lost, Reorders: v.OutOfOrder, Keys: v.Keys, Problems: v.Problems}
	for _, s := range c.steps {
		res.Note("step %d: %s: recovered=%v in %.2fs", s.N, s.desc, s.recovered, s.recovery.Seconds())
	}
	if path, err := res.WriteJSON(c.o.Out); err != nil {
		fmt.Fprintf(os.Stderr, "bench: nemesis: %v\n", err)
	} else {
		fmt.Fprintf(w, "results written to %s\n", path)
	}
	if !v.OK() {
		fmt.Fprintf(w, "!!! NEMESIS FAILED: handled_twice=%d lost=%d out_of_order=%d unexpected_dead=%d poison_unheld=%d stuck=%d\n",
			v.HandledTwice, v.Lost, v.OutOfOrder, v.UnexpectedDead, v.PoisonUnheld, v.Stuck)
	}
	fmt.Fprintln(w, consumersLine(c.o.Profile, c.seed, v, p50.Seconds(), worst.Seconds()))
	return v.OK()
}
