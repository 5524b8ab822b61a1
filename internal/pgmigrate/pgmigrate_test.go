package pgmigrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/internal/testkit"
)

func apply(t *testing.T, ctx context.Context, pool *pgxpool.Pool, fsys fstest.MapFS) error {
	t.Helper()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "test", fsys, "m")
	})
}

// TestApplyFillsInLowerVersions: a migration numbered below the newest
// applied one (merged after it) is still applied, once; a database newer
// than the binary is refused.
func TestApplyFillsInLowerVersions(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	fsys := fstest.MapFS{
		"m/0001_a.sql": {Data: []byte(`CREATE TABLE t (v text)`)},
		"m/0003_c.sql": {Data: []byte(`INSERT INTO t VALUES ('c')`)},
	}
	if err := apply(t, ctx, pool, fsys); err != nil {
		t.Fatal(err)
	}
	fsys["m/0002_b.sql"] = &fstest.MapFile{Data: []byte(`INSERT INTO t VALUES ('b')`)}
	for range 2 {
		if err := apply(t, ctx, pool, fsys); err != nil {
			t.Fatal(err)
		}
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(v, ',' ORDER BY v) FROM t`).Scan(&got); err != nil || got != "b,c" {
		t.Fatalf("rows %q (%v), want b,c: 0002 applied once", got, err)
	}
	delete(fsys, "m/0003_c.sql")
	if err := apply(t, ctx, pool, fsys); !errors.Is(err, pgmigrate.ErrNewerSchema) || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("a binary that knows less than the database: %v (want ErrNewerSchema)", err)
	}
}

// TestAdoptMatchesVersionAndName: a moved migration is recorded for its
// new owner, with its former record's applied_at, only where the former
// owner recorded that version under the moved file's name; nothing runs,
// the former record stays, and Apply then runs only what was not adopted.
func TestAdoptMatchesVersionAndName(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	old := fstest.MapFS{
		"m/0001_t.sql": {Data: []byte(`CREATE TABLE t (v text)`)},
		"m/0002_u.sql": {Data: []byte(`CREATE TABLE u (v text)`)},
	}
	if err := apply(t, ctx, pool, old); err != nil {
		t.Fatal(err)
	}
	moved := fstest.MapFS{
		"n/0001_t.sql": {Data: []byte(`CREATE TABLE t (v text)`)},
		"n/0002_u.sql": {Data: []byte(`CREATE TABLE u (v text)`)},
		"n/0003_w.sql": {Data: []byte(`CREATE TABLE w (v text)`)},
	}
	adopt := func(mv []pgmigrate.Moved) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := pgmigrate.Lock(ctx, tx); err != nil {
				return err
			}
			if err := pgmigrate.Adopt(ctx, tx, "new", moved, "n", mv); err != nil {
				return err
			}
			return pgmigrate.Apply(ctx, tx, "new", moved, "n")
		})
	}
	if err := adopt([]pgmigrate.Moved{{Version: 4, From: "test", FromVersion: 1, FromName: "0001_t.sql"}}); err == nil {
		t.Fatal("adopting a version the new owner does not have: no error")
	}
	// Version 1 matches; version 2's former record has another name, so
	// it is not the moved SQL and is applied (and fails: u exists).
	err := adopt([]pgmigrate.Moved{
		{Version: 1, From: "test", FromVersion: 1, FromName: "0001_t.sql"},
		{Version: 2, From: "test", FromVersion: 2, FromName: "0002_other.sql"},
	})
	if err == nil || !strings.Contains(err.Error(), "0002_u.sql") {
		t.Fatalf("a former record under another name was adopted: %v", err)
	}
	for range 2 {
		if err := adopt([]pgmigrate.Moved{
			{Version: 1, From: "test", FromVersion: 1, FromName: "0001_t.sql"},
			{Version: 2, From: "test", FromVersion: 2, FromName: "0002_u.sql"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	var got string
	if err := pool.QueryRow(ctx, `
SELECT string_agg(n.component || '/' || n.version || ' ' || n.name || ' ' ||
       CASE WHEN n.applied_at = f.applied_at THEN 'adopted' ELSE 'applied' END, ', ' ORDER BY n.component, n.version)
FROM ordo_schema_migrations AS n
LEFT JOIN ordo_schema_migrations AS f ON f.component = 'test' AND f.version = n.version AND n.component = 'new'`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "new/1 0001_t.sql adopted, new/2 0002_u.sql adopted, new/3 0003_w.sql applied, " +
		"test/1 0001_t.sql applied, test/2 0002_u.sql applied"; got != want {
		t.Fatalf("records:\n got %s\nwant %s", got, want)
	}
}
