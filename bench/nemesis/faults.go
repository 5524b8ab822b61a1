package nemesis

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/ordercheck"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

const (
	// parkTimeout bounds the wait for planted rows to be parked.
	parkTimeout = time.Minute
	// Types of the rows the nemesis writes itself.
	typePoison   = "nemesis.poison.v1"
	typeFollower = "nemesis.follower.v1"
	typeProbe    = "nemesis.probe.v1"
)

// healFunc ends a fault. It is idempotent.
type healFunc func(ctx context.Context) error

func once(f func(ctx context.Context) error) healFunc {
	var o sync.Once
	var err error
	return func(ctx context.Context) error {
		o.Do(func() { err = f(ctx) })
		return err
	}
}

func noHeal(context.Context) error { return nil }

// inject starts step s's fault and returns what heals it. The kinds that
// end on a condition (planted rows parked) wait for it here.
func (n *nemesis) inject(ctx context.Context, s plannedStep) (healFunc, error) {
	f, srv, t := n.f, n.srv, s.Target
	switch s.Kind {
	case kindKill:
		f.kill(t)
		return once(func(ctx context.Context) error { return f.start(ctx, t) }), nil
	case kindPause:
		if err := f.signal(t, syscall.SIGSTOP); err != nil {
			return nil, err
		}
		return once(func(context.Context) error { return f.signal(t, syscall.SIGCONT) }), nil
	case kindBrokerRestart:
		heal := once(srv.startBroker)
		return heal, srv.stopBroker(ctx)
	case kindBrokerClose:
		k, err := srv.closeConnections(ctx, f.apps(n.slots(s)...))
		if err == nil && k == 0 {
			err = fmt.Errorf("no broker connection named %v", f.apps(n.slots(s)...))
		}
		n.logf("  closed %d broker connections", k)
		return noHeal, err
	case kindPGTerminate:
		k, err := srv.terminateSessions(ctx, dbNames(n.dbs), f.apps(n.slots(s)...))
		if err == nil && k == 0 {
			err = fmt.Errorf("no PostgreSQL session named %v", f.apps(n.slots(s)...))
		}
		n.logf("  terminated %d PostgreSQL sessions", k)
		return noHeal, err
	case kindPGRestart:
		heal := once(srv.startPostgres)
		return heal, srv.stopPostgres(ctx)
	case kindGossipSplit:
		f.gossip.isolate(t)
		return once(func(context.Context) error { f.gossip.heal(); return nil }), nil
	case kindAMQPLink:
		return cutLinks(s.Variant, f.amqp[t]), nil
	case kindPGLink:
		return cutLinks(s.Variant, f.pg[t]...), nil
	case kindSourceLink:
		return n.cutSource(ctx, s)
	case kindMemoryAlarm:
		heal := once(srv.clearAlarm)
		return heal, srv.raiseAlarm(ctx)
	case kindHostileRow, kindPoison:
		return n.plantAndPark(ctx, s)
	}
	return nil, fmt.Errorf("unknown nemesis kind %q", s.Kind)
}

// cutLinks cuts or stalls (variant) every proxy of ps and returns the
// heal that restores them.
func cutLinks(variant string, ps ...*testkit.Proxy) healFunc {
	for _, p := range ps {
		if variant == variantStall {
			p.Stall()
		} else {
			p.Cut()
		}
	}
	return once(func(context.Context) error {
		for _, p := range ps {
			p.Resume()
			p.Restore()
		}
		return nil
	})
}

// slots returns the node slots step s acts on.
func (n *nemesis) slots(s plannedStep) []int {
	if s.Target < 0 {
		return n.f.all()
	}
	return []int{s.Target}
}

// planted is a row the nemesis wrote that can never be sent.
type planted struct {
	db     *runDB // its source
	id     string
	key    string
	keySeq int64
	why    string
}

// numbered fills in the row's key_seq where it had none at insert (the
// key_seq trigger dropped, -lean): a parked row was numbered before its
// first publish, in the owner's journal or, once parked, in the row.
func (p *planted) numbered(ctx context.Context) error {
	if p.keySeq > 0 {
		return nil
	}
	var keySeq *int64
	if err := p.db.pool.QueryRow(ctx, `SELECT coalesce(o.key_seq, n.key_seq) FROM outbox AS o
		LEFT JOIN outbox_numbers AS n ON n.id = o.id WHERE o.id = $1`, p.id).Scan(&keySeq); err != nil {
		return fmt.Errorf("key_seq of planted %s row %s: %w", p.why, p.id, err)
	}
	if keySeq == nil {
		return fmt.Errorf("planted %s row %s is not numbered: it was never published", p.why, p.id)
	}
	p.keySeq = *keySeq
	return nil
}

// plantAndPark writes the step's unsendable rows on live keys (orders the
// load placed and will no longer cancel), each followed in its transaction
// by a good message of its key, then cancels each order through the order
// API (a third message behind it). It waits until the operator CLI lists
// every planted row as parked; the heal skips them through the CLI.
// hostile-row plants headers over frame_max; poison one row to an exchange
// without bindings (returned) and one to an exchange that does not exist.
func (n *nemesis) plantAndPark(ctx context.Context, s plannedStep) (healFunc, error) {
	whys := []string{"hostile"}
	if s.Kind == kindPoison {
		whys = []string{"returned", "no-exchange"}
	}
	var rows []planted
	for _, why := range whys {
		o := n.load.take()
		if o.id == "" {
			return noHeal, fmt.Errorf("%s: no recent order to plant a row on", s.Kind)
		}
		row, err := n.plant(ctx, n.dbs[sourceIndex(n.dbs, o.source)], o.id, why, s.N)
		if err != nil {
			return noHeal, err
		}
		rows = append(rows, row)
		if _, err := n.load.cancel(ctx, o); err != nil {
			n.logf("  cancel of %s/%s behind the planted row: %v", o.source, o.id, err)
		}
		n.logf("  planted %s row %s on key %s/%s (key_seq %d)", why, row.id, o.source, o.id, row.keySeq)
	}
	heal := once(func(ctx context.Context) error {
		for i := range rows {
			if err := rows[i].numbered(ctx); err != nil {
				return err
			}
		}
		for _, row := range rows {
			if _, err := n.f.admin(ctx, "skip", "-source", row.db.name, row.id); err != nil {
				return err
			}
			n.skipped = append(n.skipped, skip{Source: row.db.name, Skip: ordercheck.Skip{Key: row.key, KeySeq: row.keySeq}})
		}
		n.logf("  skipped %d rows with the operator CLI (node skip)", len(rows))
		return nil
	})
	start, shown := time.Now(), time.Now()
	err := harness.WaitUntil(ctx, parkTimeout, 250*time.Millisecond, "the planted rows to be parked", func() (bool, error) {
		if err := n.f.failed(); err != nil {
			return false, err
		}
		if time.Since(shown) > 5*time.Second {
			shown = time.Now()
			n.showPlanted(ctx, rows)
		}
		for _, row := range rows {
			out, err := n.f.admin(ctx, "parked", "-source", row.db.name)
			if err != nil || !strings.Contains(out, row.id) {
				return false, nil // not parked yet, or a node restarting: ask again
			}
		}
		return true, nil
	})
	if err == nil {
		n.logf("  parked after %v (node parked lists them)", time.Since(start).Round(time.Millisecond))
	}
	return heal, err
}

// showPlanted prints the planted rows' failure bookkeeping, for a park
// that takes long.
func (n *nemesis) showPlanted(ctx context.Context, rows []planted) {
	for _, row := range rows {
		var attempts int
		var lastErr *string
		var next *time.Time
		err := row.db.pool.QueryRow(ctx, `SELECT attempts, last_error, next_attempt_at FROM outbox WHERE id = $1`, row.id).Scan(&attempts, &lastErr, &next)
		if err != nil {
			n.logf("  planted %s row: %v", row.why, err)
			continue
		}
		n.logf("  planted %s row: %d attempts, next at %v, last error %q", row.why, attempts, next, deref(lastErr))
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// plant writes one unsendable row on key of source db and a good follower
// behind it, in one transaction, and records the follower as promised.
func (n *nemesis) plant(ctx context.Context, db *runDB, key, why string, step int) (planted, error) {
	row := planted{db: db, key: key, why: why}
	var follower uuid.UUID
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		id, keySeq, err := n.insertBad(ctx, tx, key, why)
		if err != nil {
			return err
		}
		row.id, row.keySeq = id, keySeq
		ids, err := n.producer.Enqueue(ctx, tx, outbox.Message{CorrelationID: key, Exchange: n.f.exchange,
			RoutingKey: "nemesis.follower", Type: typeFollower, Payload: json.RawMessage(fmt.Sprintf(`{"step":%d}`, step))})
		if err != nil {
			return err
		}
		follower = ids[0]
		return nil
	})
	if err != nil {
		return row, fmt.Errorf("plant a %s row on %s: %w", why, key, err)
	}
	n.load.promise(promise{Source: db.name, ID: follower.String(), Key: key, Type: typeFollower, At: time.Now()})
	return row, nil
}

// insertBad inserts the unsendable row and returns its id and key_seq (0
// while it has none: the key_seq trigger dropped, -lean).
func (n *nemesis) insertBad(ctx context.Context, tx pgx.Tx, key, why string) (string, int64, error) {
	if why == "hostile" {
		// Three header values of 60 KiB: each within the limit of a
		// value, together over frame_max (128 KiB). Enqueue refuses it,
		// so it goes in as a plain INSERT would.
		id := uuid.Must(uuid.NewV7())
		var keySeq *int64
		err := tx.QueryRow(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, headers, payload)
			VALUES ($1, $2, $3, $4, 'nemesis.hostile', $5,
			jsonb_build_object('a', repeat('x', 61440), 'b', repeat('y', 61440), 'c', repeat('z', 61440)), '{}'::jsonb)
			RETURNING key_seq`, id, partition.Of(key, n.o.Partitions), key, n.f.exchange, typePoison).Scan(&keySeq)
		return id.String(), orZero(keySeq), err
	}
	ex := n.voidExchange // exists, no queue bound: the broker returns it
	if why == "no-exchange" {
		ex = n.missingExchange
	}
	ids, err := n.producer.Enqueue(ctx, tx, outbox.Message{CorrelationID: key, Exchange: ex, RoutingKey: "nemesis.poison",
		Type: typePoison, Payload: json.RawMessage(`{}`)})
	if err != nil {
		return "", 0, err
	}
	var keySeq *int64
	err = tx.QueryRow(ctx, `SELECT key_seq FROM outbox WHERE id = $1`, ids[0]).Scan(&keySeq)
	return ids[0].String(), orZero(keySeq), err
}

func orZero(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// probe commits one message on every partition of every source (one key
// per partition, the same key every step and in every source: its
// key_seq counts per (source, key)), retrying until each database takes
// them, and returns them as promises.
func (n *nemesis) probe(ctx context.Context, step int) ([]promise, error) {
	msgs := make([]outbox.Message, len(n.probeKeys))
	for p, key := range n.probeKeys {
		msgs[p] = outbox.Message{CorrelationID: key, Exchange: n.f.exchange, RoutingKey: "nemesis.probe", Type: typeProbe,
			Payload: json.RawMessage(fmt.Sprintf(`{"step":%d}`, step))}
	}
	var out []promise
	for _, db := range n.dbs {
		var ids []uuid.UUID
		err := harness.WaitUntil(ctx, 30*time.Second, 100*time.Millisecond, "the probes to commit to "+db.name, func() (bool, error) {
			err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
				var err error
				ids, err = n.producer.Enqueue(ctx, tx, msgs...)
				return err
			})
			return err == nil, nil
		})
		if err != nil {
			return nil, err
		}
		at := time.Now()
		for i, id := range ids {
			out = append(out, promise{Source: db.name, ID: id.String(), Key: msgs[i].CorrelationID, Type: typeProbe, At: at})
		}
	}
	n.load.promise(out...)
	return out, nil
}

// probeKeys returns one key per partition: "nemesis-probe-<p>-<i>" with
// the smallest i that hashes to p.
func probeKeys(partitions int) []string {
	keys := make([]string, partitions)
	for p := range partitions {
		for i := 0; ; i++ {
			k := fmt.Sprintf("nemesis-probe-%d-%d", p, i)
			if partition.Of(k, partitions) == p {
				keys[p] = k
				break
			}
		}
	}
	return keys
}
