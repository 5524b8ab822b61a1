package outbox_test

import (
	"errors"
	"io/fs"
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
)

// keyIndexMigration is the file of the migration that makes the
// (correlation_id, key_seq) index cover numbered rows only.
const keyIndexMigration = "numbered_key_index.sql"

// TestKeyIndexUpgrade upgrades a database of the release before the
// partial (correlation_id, key_seq) index, holding numbered and
// unnumbered rows: with the index built by the migration, built
// beforehand with CREATE INDEX CONCURRENTLY as docs/outbox-table.md
// says, and left invalid by a failed build of that kind. Each time the
// rows are kept, the index is the one a fresh install has (unique,
// valid, WHERE key_seq IS NOT NULL), a numbered (correlation_id,
// key_seq) is still refused twice, and unnumbered rows of a key are not.
func TestKeyIndexUpgrade(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, before := range []string{"", "prebuilt", "invalid"} {
		t.Run("index "+orElse(before, "built by the migration"), func(t *testing.T) {
			t.Parallel()
			keyIndexUpgrade(t, before)
		})
	}
}

func orElse(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}

func keyIndexUpgrade(t *testing.T, before string) {
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 60*time.Second)
	older := fstest.MapFS{}
	err := fs.WalkDir(outbox.Migrations, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		// The release before: the migrations up to the key index's, not
		// it nor any after it.
		if strings.HasSuffix(path, keyIndexMigration) || d.Name() > "0014" {
			return nil
		}
		b, err := fs.ReadFile(outbox.Migrations, path)
		older[path] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		if err := pgmigrate.Apply(ctx, tx, "outbox", older, "migrations"); err != nil {
			return err
		}
		return outbox.Install(ctx, tx, 8)
	})
	if err != nil {
		t.Fatalf("install the release before: %v", err)
	}
	mustExec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	insert := func(key string) {
		t.Helper()
		mustExec(`INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
			VALUES ($1, 1, $2, 'ex', 'rk', 't', '{}')`, uuid.Must(uuid.NewV7()), key)
	}
	insert("a") // numbered by the trigger: key_seq 1
	insert("a") // 2
	mustExec(`DROP TRIGGER outbox_assign_key_seq ON outbox`)
	insert("a") // unnumbered
	insert("b") // unnumbered
	switch before {
	case "prebuilt", "invalid":
		mustExec(`CREATE UNIQUE INDEX CONCURRENTLY outbox_key_seq_numbered
			ON outbox (correlation_id, key_seq) WHERE key_seq IS NOT NULL`)
		if before == "invalid" {
			mustExec(`UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'outbox_key_seq_numbered'::regclass`)
		}
	}
	if err := outbox.Migrate(ctx, pool, 8); err != nil {
		t.Fatalf("upgrade: %v", err)
	}

	var def string
	var valid, unique bool
	err = pool.QueryRow(ctx, `SELECT pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisunique
		FROM pg_index AS i WHERE i.indexrelid = 'outbox_key_seq_key'::regclass`).Scan(&def, &valid, &unique)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ON public.outbox USING btree (correlation_id, key_seq) WHERE (key_seq IS NOT NULL)"; !strings.HasSuffix(def, want) || !valid || !unique {
		t.Fatalf("outbox_key_seq_key: %s (valid %v, unique %v); want a valid unique index %s", def, valid, unique, want)
	}
	var others int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'outbox_key_seq_numbered'`).Scan(&others); err != nil || others != 0 {
		t.Fatalf("outbox_key_seq_numbered left behind (%d, %v)", others, err)
	}
	var rows, numbered int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(key_seq) FROM outbox`).Scan(&rows, &numbered); err != nil || rows != 4 || numbered != 2 {
		t.Fatalf("after the upgrade: %d rows, %d numbered (%v); want 4 and 2", rows, numbered, err)
	}
	var entries int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE correlation_id IN ('a', 'b') AND key_seq > 0`).Scan(&entries); err != nil || entries != 2 {
		t.Fatalf("rows found through the index: %d (%v); want 2", entries, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload)
		VALUES ($1, 1, 'a', 2, 'ex', 'rk', 't', '{}')`, uuid.Must(uuid.NewV7()))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "outbox_key_seq_key" {
		t.Fatalf("a second row at a's key_seq 2: %v; want a unique violation of outbox_key_seq_key", err)
	}
	insert("a") // a second unnumbered row of a: NULLs were never unique
}
