package produce

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
)

// A produce variant is one way a producer writes its messages, each into a
// database of its own: Ordo's outbox through plain SQL (the any-language
// contract) or outbox.Producer.Enqueue, the classic outbox table of the
// article, Ordo's table without its triggers (what the columns and
// indexes cost by themselves), and the plain INSERT with a relay node
// draining the outbox meanwhile, and the classic table with a classic
// relay, or an Ordo node adopting it, draining it meanwhile
// (produce_relay.go).
const (
	variantClassic        = "classic"
	VariantOrdoSQL        = "ordo-sql"
	variantOrdoSQLNoNotif = "ordo-sql-nonotify"
	variantOrdoEnqueue    = "ordo-enqueue"
	variantBare           = "bare"
	variantOrdoSQLRelay   = "ordo-sql-relay"
	variantClassicRelay   = "classic-relay"
	variantOrdoLean       = "ordo-lean"
	variantOrdoLeanRelay  = "ordo-lean-relay"
	variantAdoptedRelay   = "adopted-relay"
)

// What relays a variant's table during its runs (produce_relay.go).
const (
	relayNone    = ""
	relayOrdo    = "ordo"    // one Ordo node
	relayClassic = "classic" // one classic relay instance (classic.go) on classic_outbox
	relayAdopted = "adopted" // one Ordo node relaying classic_outbox as it is (-table-layout)
)

// Variants is every variant, in the order a cell runs them. classic
// comes first: every ratio is taken against it.
var Variants = []produceVariant{
	{name: variantClassic, summary: "the article's table (its OutboxMessages): id uuid PRIMARY KEY, type, routing_key, payload jsonb, correlation_id, occurred_at, processed_at; one partial index on occurred_at WHERE processed_at IS NULL", setup: setupClassic, write: writeClassic},
	{name: VariantOrdoSQL, summary: "Ordo's outbox as installed, one plain INSERT statement per row (the any-language contract)", setup: setupOrdo, write: writeOrdoSQL},
	{name: variantOrdoSQLNoNotif, summary: "ordo-sql with the NOTIFY trigger disabled (where the schema still has it)", setup: setupOrdoNoNotify, write: writeOrdoSQL},
	{name: variantOrdoEnqueue, summary: "Ordo's outbox through outbox.Producer.Enqueue, one statement per transaction", setup: setupOrdo, write: writeOrdoEnqueue},
	{name: variantBare, summary: "Ordo's table, constraints and indexes with every trigger disabled; the producer supplies key_seq and occurred_at", setup: setupBare, write: writeBare},
	{name: variantOrdoSQLRelay, summary: "ordo-sql while a relay node publishes the outbox to RabbitMQ and marks the rows (the whole cost: the producers' inserts, the relay's reads and marks)", setup: setupOrdo, write: writeOrdoSQL, relay: relayOrdo},
	{name: variantOrdoLean, summary: "ordo-sql without the key_seq trigger (outbox.DropKeySeqTrigger): the partition owner numbers the rows", setup: setupOrdoLean, write: writeOrdoSQL},
	{name: variantOrdoLeanRelay, summary: "ordo-lean while a relay node numbers, publishes and marks the rows (the whole cost without the trigger)", setup: setupOrdoLean, write: writeOrdoSQL, relay: relayOrdo},
	{name: variantAdoptedRelay, summary: "classic while one Ordo node relays classic_outbox as it is (-table-layout, relay/tablesource: its intake, numbering and marks of the user's processed_at; no trigger, column or index added): the producers' cost of adopting their table instead of the article's relay", setup: setupClassic, write: writeClassic, relay: relayAdopted},
	{name: variantClassicRelay, summary: "classic while one classic relay instance (the article's: oldest 50 pending rows FOR UPDATE SKIP LOCKED, publish each and wait for its confirm, mark, commit) drains classic_outbox to RabbitMQ: the like-for-like whole cost for ordo-sql-relay", setup: setupClassic, write: writeClassic, relay: relayClassic},
}

// produceVariant sets up its database once and then writes transactions.
type produceVariant struct {
	name    string
	summary string
	// setup prepares a fresh, empty database and returns what it noted
	// (e.g. that there was no NOTIFY trigger to disable).
	setup func(ctx context.Context, pool *pgxpool.Pool, partitions int) (note string, err error)
	// write runs the inserts of one transaction: one message per key, keys
	// sorted (so that concurrent transactions take key locks in one
	// order), inside tx.
	write func(ctx context.Context, tx pgx.Tx, w *Writer, keys []int) error
	// relay is what relays the table during the run: relayNone,
	// relayOrdo, relayClassic or relayAdopted.
	relay string
}

func FindVariant(name string) *produceVariant {
	for i := range Variants {
		if Variants[i].name == name {
			return &Variants[i]
		}
	}
	return nil
}

// Writer is what every worker of one run shares: the keys, their
// partitions, the payload, and (for bare) the key_seq counter.
type Writer struct {
	Keys       []string // correlation ids
	Partitions []int32  // partition of each key
	pad        string   // payload padding
	Exchange   string   // the messages' exchange: the run's own where a relay publishes
	dbURL      string   // the run's database
	producer   *outbox.Producer
	sleep      time.Duration // pg_sleep after the inserts (-produce-sleep)
	// bareSeq hands out key_seq values for the bare variant: unique across
	// the run, so the table's (correlation_id, key_seq) key never refuses
	// one.
	bareSeq atomic.Int64
}

// Payload is a JSON body of about the configured size.
func (w *Writer) Payload(key int) string {
	return fmt.Sprintf(`{"key":%q,"t":%d,"pad":%q}`, w.Keys[key], time.Now().UnixNano(), w.pad)
}

const (
	produceExchange = "ordo.bench.produce" // where no relay publishes
	RoutingKey      = "bench.event"
	Type            = "ordo.bench.event.v1"
)

func setupClassic(ctx context.Context, pool *pgxpool.Pool, _ int) (string, error) {
	if _, err := pool.Exec(ctx, testkit.ClassicOutboxDDL); err != nil {
		return "", fmt.Errorf("create classic table: %w", err)
	}
	return "", nil
}

func setupOrdo(ctx context.Context, pool *pgxpool.Pool, partitions int) (string, error) {
	if err := outbox.Migrate(ctx, pool, partitions); err != nil {
		return "", fmt.Errorf("migrate outbox: %w", err)
	}
	if err := lease.Migrate(ctx, pool, partitions); err != nil {
		return "", fmt.Errorf("migrate lease: %w", err)
	}
	return "", nil
}

// setupOrdoLean installs Ordo and drops the producers' key_seq trigger.
func setupOrdoLean(ctx context.Context, pool *pgxpool.Pool, partitions int) (string, error) {
	if _, err := setupOrdo(ctx, pool, partitions); err != nil {
		return "", err
	}
	if err := outbox.DropKeySeqTrigger(ctx, pool); err != nil {
		return "", fmt.Errorf("drop the key_seq trigger: %w", err)
	}
	return "", nil
}

// setupOrdoNoNotify installs Ordo and disables its NOTIFY trigger, if the
// schema has one.
func setupOrdoNoNotify(ctx context.Context, pool *pgxpool.Pool, partitions int) (string, error) {
	if _, err := setupOrdo(ctx, pool, partitions); err != nil {
		return "", err
	}
	var has bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'outbox'::regclass AND tgname = 'outbox_notify')`).Scan(&has); err != nil {
		return "", fmt.Errorf("look for the notify trigger: %w", err)
	}
	if !has {
		return "the schema has no outbox_notify trigger: same as ordo-sql", nil
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox DISABLE TRIGGER outbox_notify`); err != nil {
		return "", fmt.Errorf("disable the notify trigger: %w", err)
	}
	return "", nil
}

func setupBare(ctx context.Context, pool *pgxpool.Pool, partitions int) (string, error) {
	if _, err := setupOrdo(ctx, pool, partitions); err != nil {
		return "", err
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox DISABLE TRIGGER USER`); err != nil {
		return "", fmt.Errorf("disable the outbox triggers: %w", err)
	}
	return "", nil
}

const sqlProduceClassic = `INSERT INTO classic_outbox (id, type, routing_key, payload, correlation_id) VALUES ($1, $2, $3, $4, $5)`

func writeClassic(ctx context.Context, tx pgx.Tx, w *Writer, keys []int) error {
	for _, k := range keys {
		if _, err := tx.Exec(ctx, sqlProduceClassic, uuid.Must(uuid.NewV7()), Type, RoutingKey, w.Payload(k), w.Keys[k]); err != nil {
			return err
		}
	}
	return nil
}

// SQLOrdo is the documented plain INSERT (docs/outbox-table.md).
const SQLOrdo = `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

func writeOrdoSQL(ctx context.Context, tx pgx.Tx, w *Writer, keys []int) error {
	for _, k := range keys {
		if _, err := tx.Exec(ctx, SQLOrdo, uuid.Must(uuid.NewV7()), w.Partitions[k], w.Keys[k],
			w.Exchange, RoutingKey, Type, w.Payload(k)); err != nil {
			return err
		}
	}
	return nil
}

func writeOrdoEnqueue(ctx context.Context, tx pgx.Tx, w *Writer, keys []int) error {
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.Message{CorrelationID: w.Keys[k], Exchange: w.Exchange, RoutingKey: RoutingKey,
			Type: Type, Payload: []byte(w.Payload(k))}
	}
	_, err := w.producer.Enqueue(ctx, tx, msgs...)
	return err
}

const sqlProduceBare = `INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, occurred_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp())`

func writeBare(ctx context.Context, tx pgx.Tx, w *Writer, keys []int) error {
	for _, k := range keys {
		if _, err := tx.Exec(ctx, sqlProduceBare, uuid.Must(uuid.NewV7()), w.Partitions[k], w.Keys[k], w.bareSeq.Add(1),
			w.Exchange, RoutingKey, Type, w.Payload(k)); err != nil {
			return err
		}
	}
	return nil
}

// parseProduceVariants parses "all" or a comma-separated list of variants;
// classic is always run (the ratios need it) and comes first.
func parseProduceVariants(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		var out []string
		for _, v := range Variants {
			out = append(out, v.name)
		}
		return out, nil
	}
	out := []string{variantClassic}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if FindVariant(f) == nil {
			var names []string
			for _, v := range Variants {
				names = append(names, v.name)
			}
			return nil, fmt.Errorf("-produce-variants: unknown variant %q (want all or some of %s)", f, strings.Join(names, ", "))
		}
		if f != variantClassic {
			out = append(out, f)
		}
	}
	return out, nil
}
