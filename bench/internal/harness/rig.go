package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/childproc"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
)

// cleanupTimeout bounds all of a rig's cleanups together.
const cleanupTimeout = 60 * time.Second

// SetupTimeout bounds each setup step (create database, migrate, declare).
const SetupTimeout = 30 * time.Second

// Application names of the rig's pools, as pg_stat_activity shows them.
const (
	AppBench = "ordo_bench"       // the rig's own statements (Pool)
	AppProbe = "ordo_bench_probe" // the samplers' queries (Probe)
)

// Config is what a rig needs to know of the servers and of the nodes it
// starts.
type Config struct {
	PostgresURL   string        // admin URL: the rig creates its database through it
	AMQPURL       string        // the broker
	Partitions    int           // P, given to the node and to outbox.Migrate
	ConfirmWindow int           // W, given to the node
	NodeBin       string        // a prebuilt node binary; empty builds ./cmd/node
	Timeout       time.Duration // bound on every wait
}

// Rig is one scenario's private world: a fresh database with the outbox
// and the leases installed and a pool on it, named
// ordo_bench_<scenario>_<random>. Everything a rig creates (nodes,
// proxies, and whatever a caller registers) is registered with OnClose and
// removed by Close, last created first. A Rig is driven from one
// goroutine.
type Rig struct {
	Config Config
	Name   string // database name (and the prefix of what else the scenario names)
	DBURL  string
	Pool   *pgxpool.Pool // the bench's own statements (loads, producers, waits): application_name AppBench
	Probe  *pgxpool.Pool // the samplers' pg_stat_activity queries: application_name AppProbe
	// Exchange is the rig's topic exchange, named Name: declared by
	// DeclareExchange, empty before.
	Exchange string

	cleanups []cleanup
	nodes    int // nodes started by StartNextNode, for their names
}

type cleanup struct {
	what string
	f    func(ctx context.Context) error
}

// New creates the database (migrated, with a pool of poolConns
// connections). On error, whatever was created is removed.
func New(ctx context.Context, cfg Config, scenario string, poolConns int32) (*Rig, error) {
	r := &Rig{Config: cfg, Name: "ordo_bench_" + scenario + "_" + RandomHex(4)}
	if err := r.createDatabase(ctx, poolConns); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// OnClose registers f to run at Close.
func (r *Rig) OnClose(what string, f func(ctx context.Context) error) {
	r.cleanups = append(r.cleanups, cleanup{what, f})
}

// Close runs every cleanup, last registered first, within cleanupTimeout,
// even when the scenario's context was cancelled. Failures are printed: a
// cleanup has nobody to return them to.
func (r *Rig) Close() {
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

func (r *Rig) createDatabase(ctx context.Context, poolConns int32) error {
	sctx, cancel := context.WithTimeout(ctx, SetupTimeout)
	defer cancel()
	dbURL, drop, err := testkit.CreateDatabase(sctx, r.Config.PostgresURL, r.Name)
	if err != nil {
		return err
	}
	r.OnClose("drop database "+r.Name, drop)
	r.DBURL = dbURL
	cfg, err := pgxpool.ParseConfig(r.DBURL)
	if err != nil {
		return fmt.Errorf("postgres-url: %w", err)
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.RuntimeParams["application_name"] = AppBench
	pool, err := pgxpool.NewWithConfig(sctx, cfg)
	if err != nil {
		return fmt.Errorf("open pool on %s: %w", r.Name, err)
	}
	r.Pool = pool
	r.OnClose("close pool", func(context.Context) error { pool.Close(); return nil })
	pcfg := cfg.Copy()
	pcfg.MaxConns = 2
	pcfg.ConnConfig.RuntimeParams["application_name"] = AppProbe
	if r.Probe, err = pgxpool.NewWithConfig(sctx, pcfg); err != nil {
		return fmt.Errorf("open probe pool on %s: %w", r.Name, err)
	}
	r.OnClose("close probe pool", func(context.Context) error { r.Probe.Close(); return nil })
	if err := outbox.Migrate(sctx, pool, r.Config.Partitions); err != nil {
		return fmt.Errorf("migrate %s: %w", r.Name, err)
	}
	if err := lease.Migrate(sctx, pool, r.Config.Partitions); err != nil {
		return fmt.Errorf("migrate %s: %w", r.Name, err)
	}
	return nil
}

// StartNode starts a node named name on the rig's database, publishing
// to amqpURL (the broker, or a proxy in front of it), with extra ORDO_*
// environment. It is stopped at Close if the scenario has not stopped it.
func (r *Rig) StartNode(ctx context.Context, name, amqpURL string, env ...string) (*Node, error) {
	n, err := StartProcess(ctx, r.Config, name, r.DBURL, amqpURL, env...)
	if err != nil {
		return nil, err
	}
	r.OnClose("stop node "+name, func(context.Context) error {
		_, err := n.Stop(NodeStopTimeout)
		return err
	})
	return n, nil
}

// StartNextNode starts a node named <Name>-<k>, k counting the nodes it
// started, as StartNode does.
func (r *Rig) StartNextNode(ctx context.Context, amqpURL string, env ...string) (*Node, error) {
	r.nodes++
	return r.StartNode(ctx, fmt.Sprintf("%s-%d", r.Name, r.nodes), amqpURL, env...)
}

// DeclareExchange declares the rig's topic exchange, Exchange, deleted at
// Close. It is auto-delete, so RabbitMQ removes it with the last queue
// bound to it even if the bench dies before its cleanup.
func (r *Rig) DeclareExchange(ctx context.Context) error {
	name := r.Name
	err := testkit.UseChannel(ctx, r.Config.AMQPURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, "topic", false, true, false, false, nil)
	})
	if err != nil {
		return fmt.Errorf("declare exchange %s: %w", name, err)
	}
	r.Exchange = name
	r.OnClose("delete exchange "+name, func(ctx context.Context) error {
		err := testkit.UseChannel(ctx, r.Config.AMQPURL, func(ch *amqp.Channel) error {
			return ch.ExchangeDelete(name, false, false)
		})
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil // auto-deleted with the queue already
		}
		return err
	})
	return nil
}

// StartProxy starts a TCP proxy in front of target ("host:port"), closed at
// Close.
func (r *Rig) StartProxy(target string) (*testkit.Proxy, error) {
	p, err := testkit.StartProxy(target)
	if err != nil {
		return nil, err
	}
	r.OnClose("close proxy", func(context.Context) error { p.Close(); return nil })
	return p, nil
}

// Pending returns how many outbox rows are not processed yet.
func (r *Rig) Pending(ctx context.Context) (int, error) {
	var n int
	if err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending rows: %w", err)
	}
	return n, nil
}

// Parked returns how many outbox rows are parked.
func (r *Rig) Parked(ctx context.Context) (int, error) {
	var n int
	if err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL AND processed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count parked rows: %w", err)
	}
	return n, nil
}

// WaitParked waits, within Config.Timeout, until at least want rows are
// parked, and returns how many are. The poison keys' heads are parked by
// the node after their publish fails, which may come after every other
// row is marked (WaitPending skips those keys). abort is checked on every
// poll.
func (r *Rig) WaitParked(ctx context.Context, abort func() error, want int) (int, error) {
	var n int
	err := WaitUntil(ctx, r.Config.Timeout, 50*time.Millisecond, fmt.Sprintf("%d parked rows", want), func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		var err error
		n, err = r.Parked(ctx)
		return n >= want, err
	})
	return n, err
}

// WaitPending waits, within Config.Timeout, until no outbox row is
// pending but those whose key starts with one of skip (the poison groups'
// prefixes, whose rows stay pending), and returns when that was first
// seen. abort (a relay that died, say) is checked on every poll.
func (r *Rig) WaitPending(ctx context.Context, abort func() error, skip []string) (time.Time, error) {
	var at time.Time
	what := "no pending rows"
	if len(skip) > 0 {
		what = "no pending rows but the parked keys'"
	}
	err := WaitUntil(ctx, r.Config.Timeout, 50*time.Millisecond, what, func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		n, err := r.pendingBut(ctx, skip)
		at = time.Now()
		return n == 0, err
	})
	return at, err
}

// pendingBut is Pending without the rows whose key starts with one of
// skip; with none, the plain count (which the pending rows' index serves).
func (r *Rig) pendingBut(ctx context.Context, skip []string) (int, error) {
	if len(skip) == 0 {
		return r.Pending(ctx)
	}
	var n int
	err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL
AND NOT correlation_id LIKE ANY (SELECT p || '%' FROM unnest($1::text[]) AS p)`, skip).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count pending rows: %w", err)
	}
	return n, nil
}

// WaitUntil evaluates cond every poll until it holds, returns an error, ctx
// ends or timeout passes.
func WaitUntil(ctx context.Context, timeout, poll time.Duration, what string, cond func() (bool, error)) error {
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

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// StartOrderAPI builds and starts the order API (cmd/orderapi), named
// name, on database dbURL, its events addressed to exchange, with a pool
// of 8 connections unless env (extra ORDO_* variables) says otherwise,
// stopped at Close, and waits until it answers.
func (r *Rig) StartOrderAPI(ctx context.Context, name, dbURL, exchange string, env ...string) (*Node, error) {
	bin, _, err := childproc.Build(ctx, "github.com/ordo-relay/ordo/cmd/orderapi")
	if err != nil {
		return nil, err
	}
	o := r.Config
	o.NodeBin = bin // StartProcess runs any binary configured by ORDO_* variables
	n, err := StartProcess(ctx, o, name, dbURL, o.AMQPURL, append([]string{"ORDO_EXCHANGE=" + exchange, "ORDO_DB_MAX_CONNS=8"}, env...)...)
	if err != nil {
		return nil, err
	}
	r.OnClose("stop "+name, func(context.Context) error { _, err := n.Stop(NodeStopTimeout); return err })
	client := &http.Client{Timeout: time.Second}
	err = WaitUntil(ctx, time.Minute, 50*time.Millisecond, "the order API to answer", func() (bool, error) {
		if err := n.Failed(); err != nil {
			return false, err
		}
		resp, err := client.Get("http://" + n.HTTPAddr + "/healthz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return n, err
}
