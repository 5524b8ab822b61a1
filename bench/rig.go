package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
)

// cleanupTimeout bounds all of a rig's cleanups together.
const cleanupTimeout = 60 * time.Second

// setupTimeout bounds each setup step (create database, migrate, declare).
const setupTimeout = 30 * time.Second

// rig is one scenario's private world: a fresh database with the outbox
// installed, a pool on it, and a topic exchange, all named
// ordo_bench_<scenario>_<random>. Everything a rig creates (consumers,
// nodes, proxies too) is registered with onClose and removed by close, last
// created first.
type rig struct {
	o        options
	name     string // database and exchange name
	dbURL    string
	pool     *pgxpool.Pool // the bench's own statements (loads, producers, waits): application_name ordo_bench
	probe    *pgxpool.Pool // the samplers' pg_stat_activity queries: application_name ordo_bench_probe
	exchange string
	// durableQueue makes the consumer's queue durable (and not exclusive),
	// so that a persistent message's confirm waits for the broker's fsync.
	durableQueue bool
	nodes        int // nodes started, for unique names

	cleanups []cleanup
}

type cleanup struct {
	what string
	f    func(ctx context.Context) error
}

// newRig creates the database (migrated, with a pool of poolConns
// connections) and the exchange. On error, whatever was created is removed.
func newRig(ctx context.Context, o options, scenario string, poolConns int32) (*rig, error) {
	r := &rig{o: o, name: "ordo_bench_" + scenario + "_" + randomHex(4)}
	done := false
	defer func() {
		if !done { // not the named result: a "return nil, err" has set that to nil
			r.close()
		}
	}()
	if err := r.createDatabase(ctx, poolConns); err != nil {
		return nil, err
	}
	if err := r.declareExchange(ctx); err != nil {
		return nil, err
	}
	done = true
	return r, nil
}

// onClose registers f to run at close.
func (r *rig) onClose(what string, f func(ctx context.Context) error) {
	r.cleanups = append(r.cleanups, cleanup{what, f})
}

// close runs every cleanup, last registered first, within cleanupTimeout,
// even when the scenario's context was cancelled. Failures are printed: a
// cleanup has nobody to return them to.
func (r *rig) close() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		c := r.cleanups[i]
		if err := c.f(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "bench: cleanup: %s: %v\n", c.what, err)
		}
	}
	r.cleanups = nil
}

func (r *rig) createDatabase(ctx context.Context, poolConns int32) error {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	dbURL, drop, err := testkit.CreateDatabase(sctx, r.o.PostgresURL, r.name)
	if err != nil {
		return err
	}
	r.onClose("drop database "+r.name, drop)
	r.dbURL = dbURL
	cfg, err := pgxpool.ParseConfig(r.dbURL)
	if err != nil {
		return fmt.Errorf("postgres-url: %w", err)
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.RuntimeParams["application_name"] = appBench
	pool, err := pgxpool.NewWithConfig(sctx, cfg)
	if err != nil {
		return fmt.Errorf("open pool on %s: %w", r.name, err)
	}
	r.pool = pool
	r.onClose("close pool", func(context.Context) error { pool.Close(); return nil })
	pcfg := cfg.Copy()
	pcfg.MaxConns = 2
	pcfg.ConnConfig.RuntimeParams["application_name"] = appProbe
	if r.probe, err = pgxpool.NewWithConfig(sctx, pcfg); err != nil {
		return fmt.Errorf("open probe pool on %s: %w", r.name, err)
	}
	r.onClose("close probe pool", func(context.Context) error { r.probe.Close(); return nil })
	if err := outbox.Migrate(sctx, pool, r.o.Partitions); err != nil {
		return fmt.Errorf("migrate %s: %w", r.name, err)
	}
	if err := lease.Migrate(sctx, pool, r.o.Partitions); err != nil {
		return fmt.Errorf("migrate %s: %w", r.name, err)
	}
	return nil
}

// declareExchange declares the rig's topic exchange. It is auto-delete, so
// RabbitMQ removes it with the consumer's queue even if the bench dies
// before its cleanup.
func (r *rig) declareExchange(ctx context.Context) error {
	r.exchange = r.name
	err := testkit.Channel(ctx, r.o.AMQPURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(r.exchange, "topic", false, true, false, false, nil)
	})
	if err != nil {
		return fmt.Errorf("declare exchange %s: %w", r.exchange, err)
	}
	r.onClose("delete exchange "+r.exchange, func(ctx context.Context) error {
		err := testkit.Channel(ctx, r.o.AMQPURL, func(ch *amqp.Channel) error {
			return ch.ExchangeDelete(r.exchange, false, false)
		})
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil // auto-deleted with the queue already
		}
		return err
	})
	return nil
}

// startConsumer starts the rig's consumer, stopped at close.
func (r *rig) startConsumer(ctx context.Context) (*consumer, error) {
	c, err := startConsumer(ctx, r.o.AMQPURL, r.exchange, r.name, r.durableQueue)
	if err != nil {
		return nil, err
	}
	r.onClose("stop consumer", func(context.Context) error { return c.close() })
	return c, nil
}

// startNode starts a relay node on the rig's database, publishing to
// amqpURL (the broker, or a proxy in front of it). It is stopped at close
// if the scenario has not stopped it.
func (r *rig) startNode(ctx context.Context, amqpURL string) (*node, error) {
	r.nodes++
	return r.startNamedNode(ctx, fmt.Sprintf("%s-%d", r.name, r.nodes), amqpURL)
}

// startNamedNode is startNode with a given node name and extra ORDO_*
// environment.
func (r *rig) startNamedNode(ctx context.Context, name, amqpURL string, env ...string) (*node, error) {
	n, err := startNode(ctx, r.o, name, r.dbURL, amqpURL, env...)
	if err != nil {
		return nil, err
	}
	r.onClose("stop node "+name, func(context.Context) error {
		_, err := n.stop(nodeStopTimeout)
		return err
	})
	return n, nil
}

// startProxy starts a TCP proxy in front of target ("host:port"), closed at
// close.
func (r *rig) startProxy(target string) (*testkit.Proxy, error) {
	p, err := testkit.StartProxy(target)
	if err != nil {
		return nil, err
	}
	r.onClose("close proxy", func(context.Context) error { p.Close(); return nil })
	return p, nil
}

// pending returns how many outbox rows are not processed yet.
func (r *rig) pending(ctx context.Context) (int, error) {
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending rows: %w", err)
	}
	return n, nil
}

// waitPending waits until no outbox row is pending and returns when that
// was first seen. abort (a relay that died, say) is checked on every poll.
func (r *rig) waitPending(ctx context.Context, abort func() error) (time.Time, error) {
	var at time.Time
	err := waitUntil(ctx, r.o.Timeout, 50*time.Millisecond, "no pending rows", func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		p, err := r.pending(ctx)
		at = time.Now()
		return p == 0, err
	})
	return at, err
}

// waitPendingWhere is waitPending for the rows whose key starts with none
// of skip (the poison groups' prefixes, whose rows stay pending).
func (r *rig) waitPendingWhere(ctx context.Context, abort func() error, skip []string) (time.Time, error) {
	if len(skip) == 0 {
		return r.waitPending(ctx, abort)
	}
	var at time.Time
	err := waitUntil(ctx, r.o.Timeout, 50*time.Millisecond, "no pending rows but the parked keys'", func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		var n int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL
AND NOT correlation_id LIKE ANY (SELECT p || '%' FROM unnest($1::text[]) AS p)`, skip).Scan(&n)
		if err != nil {
			return false, fmt.Errorf("count pending rows: %w", err)
		}
		at = time.Now()
		return n == 0, nil
	})
	return at, err
}

// parked returns how many outbox rows are parked.
func (r *rig) parked(ctx context.Context) (int, error) {
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL AND processed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count parked rows: %w", err)
	}
	return n, nil
}

// waitUntil evaluates cond every poll until it holds, returns an error, ctx
// ends or timeout passes.
func waitUntil(ctx context.Context, timeout, poll time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("wait for %s: not within %v", what, timeout)
		case <-tick.C:
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
