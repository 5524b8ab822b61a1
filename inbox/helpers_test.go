package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// newDB creates a database with the inbox schema and a table the test
// handlers write to: handled(key, seq) gets one row per handler commit.
func newDB(tb testing.TB) (string, *pgxpool.Pool) {
	tb.Helper()
	url, pool := testkit.NewDatabasePool(tb, 6)
	ctx := testkit.Context(tb, 30*time.Second)
	if err := inbox.Migrate(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE handled (
		n bigserial PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, instance text NOT NULL DEFAULT '')`); err != nil {
		tb.Fatal(err)
	}
	return url, pool
}

// recordHandler records each message in the handled table.
func recordHandler(instance string) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO handled (key, seq, instance) VALUES ($1, $2, $3)`, m.CorrelationID, m.KeySeq, instance)
		return err
	}
}

// recordQueue is recordHandler as an inbox.QueueHandler.
func recordQueue(instance string) inbox.QueueHandler {
	return func(_ context.Context, m *inbox.Message, b *pgx.Batch) error {
		b.Queue(`INSERT INTO handled (key, seq, instance) VALUES ($1, $2, $3)`, m.CorrelationID, m.KeySeq, instance)
		return nil
	}
}

// handledSeqs returns, per key, the key_seqs in handled in commit order.
func handledSeqs(tb testing.TB, pool *pgxpool.Pool) map[string][]int64 {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, seq FROM handled ORDER BY n`)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string][]int64{}
	for rows.Next() {
		var k string
		var s int64
		if err := rows.Scan(&k, &s); err != nil {
			tb.Fatal(err)
		}
		out[k] = append(out[k], s)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// checkOnceInOrder fails tb unless every key in want was handled exactly
// 1..want[key] in order, and nothing else was handled.
func checkOnceInOrder(tb testing.TB, got map[string][]int64, want map[string]int64) {
	tb.Helper()
	if err := onceInOrder(got, want); err != nil {
		tb.Fatal(err)
	}
}

func onceInOrder(got map[string][]int64, want map[string]int64) error {
	var errs []error
	for k, n := range want {
		seqs := got[k]
		ok := int64(len(seqs)) == n
		for i := 0; ok && i < len(seqs); i++ {
			ok = seqs[i] == int64(i+1)
		}
		if !ok {
			errs = append(errs, fmt.Errorf("key %s handled %v, want 1..%d once each in order", k, seqs, n))
		}
	}
	for k, seqs := range got {
		if _, ok := want[k]; !ok {
			errs = append(errs, fmt.Errorf("key %s handled %v, want nothing", k, seqs))
		}
	}
	return errors.Join(errs...)
}

// msg builds a message of key with key_seq seq (prev seq-1) in partition p.
func msg(key string, seq int64, p int) *inbox.Message {
	return &inbox.Message{
		ID: fmt.Sprintf("%s-%d", key, seq), CorrelationID: key, KeySeq: seq, PrevKeySeq: seq - 1,
		Partition: p, Type: "t", Exchange: "ex", RoutingKey: "rk",
		Timestamp: time.Now().Truncate(time.Second), Body: []byte(`{}`),
	}
}

// fakeDead records dead-lettered messages.
type fakeDead struct {
	mu   sync.Mutex
	msgs []string
}

func (f *fakeDead) DeadLetter(_ context.Context, m *inbox.Message, reason string, attempts int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, fmt.Sprintf("%s/%d after %d", m.CorrelationID, m.KeySeq, attempts))
	return nil
}

func (f *fakeDead) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.msgs...)
}

func deliveryOf(corr string, headers map[string]any) *amqp.Delivery {
	return &amqp.Delivery{MessageId: "m1", CorrelationId: corr, Headers: amqp.Table(headers), Body: []byte("{}")}
}
