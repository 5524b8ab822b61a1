package pgmigrate_test

import (
	"context"
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
	_, pool := testkit.NewTestDB(t, 2)
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
	if err := apply(t, ctx, pool, fsys); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("a binary that knows less than the database: %v", err)
	}
}
