package outbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
)

// BenchmarkInsertStatement measures the backend's cost of one producer
// INSERT statement (docs/outbox-table.md, "What an insert costs"): the
// article-shaped classic table, Ordo's outbox without the key_seq
// trigger, and with it, each in a fresh database. A PL/pgSQL loop on the
// server runs b.N one-row INSERT statements (each prepared and executed
// as a producer's is: executor start, constraints, index predicates), so
// ns/op is one INSERT's work in one backend, without the network, the
// commit or other backends. Keys are 10,000, the payload about 300 B,
// every row in partition 1 (the trigger keeps a key in one partition).
// Compare the variants within one run, alternating with -count:
//
//	go test -run - -bench InsertStatement -count 5 ./outbox
func BenchmarkInsertStatement(b *testing.B) {
	for _, v := range []struct {
		name  string
		setup func(b *testing.B) (*pgxpool.Pool, string) // a fresh database and the loop's INSERT
	}{
		{"classic", setupClassicTable},
		{"lean", func(b *testing.B) (*pgxpool.Pool, string) { return setupOutbox(b, false) }},
		{"trigger", func(b *testing.B) (*pgxpool.Pool, string) { return setupOutbox(b, true) }},
	} {
		b.Run(v.name, func(b *testing.B) {
			pool, insert := v.setup(b)
			ctx := testkit.Context(b, 10*time.Minute)
			fn := `CREATE FUNCTION bench_insert(n int) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    p text := repeat('x', 250);
BEGIN
    FOR i IN 1..n LOOP
        ` + insert + `;
    END LOOP;
END
$f$`
			if _, err := pool.Exec(ctx, fn); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `SELECT bench_insert(1000)`); err != nil { // warm the caches and plans
				b.Fatal(err)
			}
			b.ResetTimer()
			if _, err := pool.Exec(ctx, `SELECT bench_insert($1)`, b.N); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func setupClassicTable(b *testing.B) (*pgxpool.Pool, string) {
	_, pool := testkit.NewDatabasePool(b, 1)
	if _, err := pool.Exec(testkit.Context(b, 30*time.Second), testkit.ClassicOutboxDDL); err != nil {
		b.Fatal(err)
	}
	return pool, `INSERT INTO classic_outbox (id, type, routing_key, payload, correlation_id)
        VALUES (gen_random_uuid(), 'ordo.bench.event.v1', 'bench.event', jsonb_build_object('k', i, 'pad', p), 'key-' || (i % 10000))`
}

func setupOutbox(b *testing.B, trigger bool) (*pgxpool.Pool, string) {
	_, pool := testkit.NewDatabasePool(b, 1)
	ctx := testkit.Context(b, 30*time.Second)
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		b.Fatal(err)
	}
	if err := lease.Migrate(ctx, pool, 64); err != nil {
		b.Fatal(err)
	}
	if !trigger {
		if err := outbox.DropKeySeqTrigger(ctx, pool); err != nil {
			b.Fatal(err)
		}
	}
	return pool, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
        VALUES (gen_random_uuid(), 1, 'key-' || (i % 10000), 'ordo.bench.produce', 'bench.event', 'ordo.bench.event.v1', jsonb_build_object('k', i, 'pad', p))`
}
