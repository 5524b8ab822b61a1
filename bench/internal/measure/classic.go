package measure

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/wire"
)

// The classic relay is the article's design (docs/bench.md, "classic"),
// rebuilt as the baseline Ordo is compared with. Each instance is what one
// API instance runs: a loop with its own database connection and AMQP
// channel that, every second and immediately again while batches come back
// full, takes the oldest pending rows FOR UPDATE SKIP LOCKED, publishes
// them one by one waiting for each confirm, marks them processed and
// commits. Several instances share the table through SKIP LOCKED, which
// is exactly what loses per-key order.

const (
	// classicStepTimeout bounds one batch: select, publishes, update, commit.
	classicStepTimeout = 30 * time.Second
	// classicRetry is the pause after a failed batch.
	classicRetry = time.Second
	// classicErrorsShown is how many batch errors an instance prints.
	classicErrorsShown = 5
)

// sqlClassicSelect is the article's read: the oldest pending rows, locked,
// skipping rows another instance has locked.
const sqlClassicSelect = `
SELECT id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, headers, occurred_at
FROM outbox
WHERE processed_at IS NULL
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`

// sqlClassicIndex is the classic relay's own index for its read: the
// oldest pending rows in seq order. Ordo's outbox has none (its relay
// reads pending rows by partition), so the classic relay brings the
// index every classic outbox has: its pending rows by age.
const sqlClassicIndex = `CREATE INDEX IF NOT EXISTS bench_classic_pending ON outbox (seq) WHERE processed_at IS NULL`

// classicIndex creates the classic relay's index on the rig's outbox.
func classicIndex(ctx context.Context, r *harness.Rig) error {
	sctx, cancel := context.WithTimeout(ctx, harness.SetupTimeout)
	defer cancel()
	if _, err := r.Pool.Exec(sctx, sqlClassicIndex); err != nil {
		return fmt.Errorf("create the classic relay's index: %w", err)
	}
	return nil
}

// sqlClassicMark marks a batch processed.
const sqlClassicMark = `UPDATE outbox SET processed_at = clock_timestamp() WHERE id = ANY($1::uuid[])`

// ClassicConfig configures one classic relay instance.
type ClassicConfig struct {
	Name     string        // for messages
	DBURL    string        // the outbox database
	AMQPURL  string        // the broker
	Batch    int           // rows per batch (the article: 50)
	Interval time.Duration // pause after a batch that was not full (the article: 1 s)
	// Select and Mark replace sqlClassicSelect and sqlClassicMark (same
	// columns and parameters), for a table other than Ordo's outbox;
	// Exchange, when set, is every message's exchange.
	Select, Mark, Exchange string
}

// ClassicRelay is one instance. Run blocks until ctx ends.
type ClassicRelay struct {
	Cfg ClassicConfig

	mu        sync.Mutex
	published int
	batches   int
	errors    int
}

// Run connects and relays until ctx ends. A failed batch is rolled back
// and the instance reconnects after classicRetry; only a cancelled ctx
// ends it (with nil).
func (c *ClassicRelay) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.mu.Lock()
		c.errors++
		shown := c.errors <= classicErrorsShown
		c.mu.Unlock()
		if shown {
			fmt.Fprintf(os.Stderr, "bench: classic %s: %v; retrying\n", c.Cfg.Name, err)
		}
		if harness.Sleep(ctx, classicRetry) != nil {
			return nil
		}
	}
	return nil
}

// classicSession is one instance's connections.
type classicSession struct {
	db      *pgx.Conn
	ch      *amqp.Channel
	confirm chan amqp.Confirmation
	returns chan amqp.Return
}

// session connects, then runs batches until an error or ctx ends.
func (c *ClassicRelay) session(ctx context.Context) error {
	dbCfg, err := pgx.ParseConfig(c.Cfg.DBURL)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	dbCfg.RuntimeParams["application_name"] = AppClassic
	db, err := pgx.ConnectConfig(ctx, dbCfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer db.Close(context.Background())
	conn, err := amqp.DialConfig(c.Cfg.AMQPURL, amqp.Config{
		Heartbeat:  10 * time.Second,
		Dial:       amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{"connection_name": "ordo bench classic " + c.Cfg.Name},
	})
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	s := &classicSession{
		db: db, ch: ch,
		// One publish is outstanding at a time: buffers of a few are plenty,
		// and amqp091-go closes them when the channel closes.
		confirm: ch.NotifyPublish(make(chan amqp.Confirmation, 4)),
		returns: ch.NotifyReturn(make(chan amqp.Return, 4)),
	}
	for {
		n, err := c.batch(ctx, s)
		if err != nil {
			return err
		}
		if n == c.Cfg.Batch {
			continue // full: there is probably more
		}
		if err := harness.Sleep(ctx, c.Cfg.Interval); err != nil {
			return err
		}
	}
}

// classicRow is one selected outbox row.
type classicRow struct {
	id         [16]byte // scanned and passed as bytes: pgx encodes them directly
	partition  int32
	key        string
	keySeq     int64
	exchange   string
	routingKey string
	typ        string
	payload    []byte
	headers    map[string]any
	occurredAt time.Time
}

// batch runs one transaction: select, publish each and wait for its
// confirm, mark, commit. It returns how many rows it relayed.
func (c *ClassicRelay) batch(ctx context.Context, s *classicSession) (int, error) {
	bctx, cancel := context.WithTimeout(ctx, classicStepTimeout)
	defer cancel()
	tx, err := s.db.Begin(bctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // no-op after Commit
	sel, mark := cmp.Or(c.Cfg.Select, sqlClassicSelect), cmp.Or(c.Cfg.Mark, sqlClassicMark)
	rows, err := tx.Query(bctx, sel, c.Cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("select batch: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (classicRow, error) {
		var x classicRow
		var headers []byte
		err := r.Scan(&x.id, &x.partition, &x.key, &x.keySeq, &x.exchange, &x.routingKey, &x.typ,
			&x.payload, &headers, &x.occurredAt)
		if err == nil && len(headers) > 0 {
			err = json.Unmarshal(headers, &x.headers)
		}
		x.exchange = cmp.Or(c.Cfg.Exchange, x.exchange)
		return x, err
	})
	if err != nil {
		return 0, fmt.Errorf("select batch: %w", err)
	}
	if len(batch) == 0 {
		return 0, tx.Commit(bctx)
	}
	ids := make([][16]byte, len(batch))
	for i := range batch {
		if err := publishAndWait(bctx, s, &batch[i]); err != nil {
			return 0, err
		}
		ids[i] = batch[i].id
	}
	if _, err := tx.Exec(bctx, mark, ids); err != nil {
		return 0, fmt.Errorf("mark batch: %w", err)
	}
	if err := tx.Commit(bctx); err != nil {
		return 0, fmt.Errorf("commit batch: %w", err)
	}
	c.mu.Lock()
	c.published += len(batch)
	c.batches++
	c.mu.Unlock()
	return len(batch), nil
}

// publishAndWait publishes one row (mandatory, persistent, with Ordo's
// headers taken from the row so the checker can judge the order) and
// waits for its confirm. A nack or a return is an error: the batch rolls
// back and is tried again.
func publishAndWait(ctx context.Context, s *classicSession, x *classicRow) error {
	h := make(amqp.Table, len(x.headers)+4)
	for k, v := range x.headers {
		h[k] = v
	}
	h[wire.HeaderKeySeq] = x.keySeq
	h[wire.HeaderPrevKeySeq] = x.keySeq - 1
	h[wire.HeaderPartition] = x.partition
	h[wire.HeaderEpoch] = int64(0)
	err := s.ch.PublishWithContext(ctx, x.exchange, x.routingKey, true, false, amqp.Publishing{
		Headers:       h,
		ContentType:   "application/json",
		DeliveryMode:  amqp.Persistent,
		CorrelationId: x.key,
		MessageId:     uuid.UUID(x.id).String(),
		Timestamp:     x.occurredAt,
		Type:          x.typ,
		Body:          x.payload,
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w", uuid.UUID(x.id), err)
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("confirm of %s: %w", uuid.UUID(x.id), ctx.Err())
	case cf, ok := <-s.confirm:
		if !ok {
			return fmt.Errorf("confirm of %s: channel closed", uuid.UUID(x.id))
		}
		// A return comes before its ack, from the same goroutine: it is
		// in the buffer by now if there was one.
		select {
		case ret := <-s.returns:
			return fmt.Errorf("message %s returned: %s", ret.MessageId, ret.ReplyText)
		default:
		}
		if !cf.Ack {
			return fmt.Errorf("message %s nacked", uuid.UUID(x.id))
		}
		return nil
	}
}

// Stats returns what the instance has done.
func (c *ClassicRelay) Stats() (published, batches, errs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.published, c.batches, c.errors
}

// ClassicSystem is n classic instances running as goroutines of the bench.
type ClassicSystem struct {
	relays []*ClassicRelay
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startClassic starts n instances on the rig's database; stop (or the
// rig's close) stops them and waits.
func startClassic(r *harness.Rig, cl ClassicPolling, n int) *ClassicSystem {
	ctx, cancel := context.WithCancel(context.Background())
	s := &ClassicSystem{cancel: cancel}
	for i := range n {
		c := &ClassicRelay{Cfg: ClassicConfig{
			Name: fmt.Sprintf("c%d", i+1), DBURL: r.DBURL, AMQPURL: r.Config.AMQPURL,
			Batch: cl.ClassicBatch, Interval: cl.ClassicEvery,
		}}
		s.relays = append(s.relays, c)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = c.Run(ctx) // returns nil once ctx ends; errors are retried
		}()
	}
	r.OnClose("stop classic relays", func(context.Context) error { return s.Stop() })
	return s
}

// Failed is nil: an instance retries every error itself.
func (s *ClassicSystem) Failed() error { return nil }

// Usage is not measurable: the instances run inside the bench process.
func (s *ClassicSystem) Usage() (time.Duration, float64, error) {
	return 0, 0, errors.ErrUnsupported
}

// Stop cancels every instance and waits for them. It is idempotent.
func (s *ClassicSystem) Stop() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// AddTo adds the instances' totals to res.
func (s *ClassicSystem) AddTo(res *result.Result) {
	var pub, batches, errs int
	for _, c := range s.relays {
		p, b, e := c.Stats()
		pub, batches, errs = pub+p, batches+b, errs+e
	}
	res.Figure("classic_published", float64(pub), "")
	res.Figure("classic_batches", float64(batches), "")
	res.Figure("classic_errors", float64(errs), "")
}
