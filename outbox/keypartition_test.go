package outbox_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

const plainInsert = `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
	VALUES ($1, $2, $3, 'ex', 'rk', 't', '{}')`

// requireKeyPartitionError checks that err is the database's refusal of a
// row whose partition disagrees with its key's, naming both partitions.
func requireKeyPartitionError(t *testing.T, err error, key string, keyPart, rowPart int) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "outbox_key_partition" {
		t.Fatalf("err = %v, want a check violation of outbox_key_partition", err)
	}
	for _, want := range []string{key, "partition " + strconv.Itoa(keyPart), "partition " + strconv.Itoa(rowPart)} {
		if !strings.Contains(pgErr.Message, want) {
			t.Errorf("message %q does not name %q", pgErr.Message, want)
		}
	}
}

// TestPlainInsertPartitionMismatch: a plain INSERT whose partition
// disagrees with the key's earlier rows is refused, naming both
// partitions, and consumes no key_seq.
func TestPlainInsertPartitionMismatch(t *testing.T) {
	t.Parallel()
	pool, prod := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	key := "split-me"
	right := partition.Of(key, 64)
	wrong := (right + 1) % 64
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), right, key); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), wrong, key)
	requireKeyPartitionError(t, err, key, right, wrong)

	// The refused row took no key_seq: the next rows get 2 and 3, by plain
	// INSERT and by Enqueue.
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), right, key); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := prod.Enqueue(ctx, tx, msg(key))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `SELECT key_seq FROM outbox WHERE correlation_id = $1 ORDER BY key_seq`, key)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seqs) != 3 || seqs[2] != 3 {
		t.Fatalf("key_seq %v (%v), want [1 2 3]", seqs, err)
	}

	// A key's first row decides, whoever writes it: Enqueue then refuses
	// the (right) partition of a key first written to a wrong one.
	wrongFirst := (partition.Of("first-wrong", 64) + 1) % 64
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), wrongFirst, "first-wrong"); err != nil {
		t.Fatal(err)
	}
	for _, way := range enqueueWays {
		_, err = way.enqueue(ctx, pool, prod, msg("first-wrong"))
		if !errors.Is(err, outbox.ErrKeyPartition) {
			t.Fatalf("%s into a key first written to another partition: %v, want ErrKeyPartition", way.name, err)
		}
		requireKeyPartitionError(t, err, "first-wrong", wrongFirst, partition.Of("first-wrong", 64))
	}
}

// TestKeyPartitionBackfill: migrating an outbox that already holds rows
// records each key's partition from them (the latest row's, if a key is
// already split), so the check holds for keys written before it; also
// when the database had migration 0008 before 0007.
func TestKeyPartitionBackfill(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	// Install migrations 1 to 8 but 0007, as main did before 0007 was
	// merged (0008 came first), and write some rows. (Later migrations
	// rely on 0007's column.)
	old := fstest.MapFS{}
	entries, err := os.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "0007") && e.Name() < "0009" {
			b, err := os.ReadFile("migrations/" + e.Name())
			if err != nil {
				t.Fatal(err)
			}
			old["migrations/"+e.Name()] = &fstest.MapFile{Data: b}
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "outbox", old, "migrations")
	}); err != nil {
		t.Fatal(err)
	}
	a, b := "key-a", "key-b"
	for _, r := range []struct {
		key  string
		part int
	}{{a, partition.Of(a, 64)}, {a, partition.Of(a, 64)}, {b, 5}, {b, 6}} {
		if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), r.part, r.key); err != nil {
			t.Fatal(err)
		}
	}
	// A key whose rows retention deleted: its partition is unknown.
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), 9, "key-gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE correlation_id = 'key-gone'`); err != nil {
		t.Fatal(err)
	}

	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	// 0007, applied after 0008, keeps 0008's setting of the trigger.
	var config []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(proconfig, '{}') FROM pg_proc WHERE proname = 'outbox_assign_key_seq'`).Scan(&config); err != nil {
		t.Fatal(err)
	}
	if len(config) != 1 || config[0] != "enable_seqscan=off" {
		t.Errorf("trigger function settings %q, want enable_seqscan=off", config)
	}
	wrongA := (partition.Of(a, 64) + 1) % 64
	_, err = pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), wrongA, a)
	requireKeyPartitionError(t, err, a, partition.Of(a, 64), wrongA)
	_, err = pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), 5, b)
	requireKeyPartitionError(t, err, b, 6, 5)
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), 6, b); err != nil {
		t.Fatalf("key-b's latest partition refused: %v", err)
	}
	// The unknown one is taken from the next row, then holds.
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), 10, "key-gone"); err != nil {
		t.Fatalf("a key with no rows left: %v", err)
	}
	_, err = pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), 9, "key-gone")
	requireKeyPartitionError(t, err, "key-gone", 10, 9)
}
