package lease_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

const partitions = 16

// migrateAll is what a node does at start: the outbox's migrations, then
// the lease tables'.
func migrateAll(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool, partitions); err != nil {
		return err
	}
	return lease.Migrate(ctx, pool, partitions)
}

// oldOutboxMigrations is the outbox component's migrations 1..upTo as the
// releases before the lease component shipped them (testdata/README.md).
func oldOutboxMigrations(tb testing.TB, upTo int) fstest.MapFS {
	tb.Helper()
	dir := filepath.Join("testdata", "outbox-99ac80e")
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	fsys := fstest.MapFS{}
	for _, e := range entries {
		num, _, _ := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			tb.Fatalf("testdata file %s: %v", e.Name(), err)
		}
		if v > upTo {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		fsys["m/"+e.Name()] = &fstest.MapFile{Data: b}
	}
	if len(fsys) != upTo {
		tb.Fatalf("testdata holds %d of the old migrations 1..%d", len(fsys), upTo)
	}
	return fsys
}

// oldMigrate does what outbox.Migrate of a release that knew outbox
// migrations 1..upTo did: apply the ones not recorded, store P and its
// constraint at install, and seed the lease rows (which that release's
// outbox owned) at every start.
func oldMigrate(ctx context.Context, pool *pgxpool.Pool, fsys fstest.MapFS) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		if err := pgmigrate.Apply(ctx, tx, "outbox", fsys, "m"); err != nil {
			return err
		}
		var installed int
		err := tx.QueryRow(ctx, `SELECT partitions FROM ordo_settings`).Scan(&installed)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if _, err := tx.Exec(ctx, `INSERT INTO ordo_settings (partitions) VALUES ($1)`, partitions); err != nil {
				return err
			}
			ddl := fmt.Sprintf(`ALTER TABLE outbox ADD CONSTRAINT outbox_partition_range CHECK (partition >= 0 AND partition < %d)`, partitions)
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return err
			}
		case err != nil:
			return err
		case installed != partitions:
			return fmt.Errorf("installed with %d partitions", installed)
		}
		if _, leases := fsys["m/0002_leases.sql"]; !leases {
			return nil // a release from before the lease table
		}
		_, err = tx.Exec(ctx, `INSERT INTO ordo_leases (partition)
			SELECT g FROM generate_series(0, $1::int - 1) AS g ON CONFLICT (partition) DO NOTHING`, partitions)
		return err
	})
}

// outboxVersions returns the outbox migrations' versions this release
// ships, ascending.
func outboxVersions(tb testing.TB) []int {
	tb.Helper()
	entries, err := os.ReadDir(filepath.Join("..", "outbox", "migrations"))
	if err != nil {
		tb.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		num, _, _ := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			tb.Fatalf("outbox migration %s: %v", e.Name(), err)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

type schemaRecord struct {
	name      string
	appliedAt string // as PostgreSQL prints it, to the microsecond
}

// schemaRecords returns ordo_schema_migrations by "component/version".
func schemaRecords(tb testing.TB, ctx context.Context, pool *pgxpool.Pool) map[string]schemaRecord {
	tb.Helper()
	rows, err := pool.Query(ctx, `SELECT component || '/' || version, name, applied_at::text FROM ordo_schema_migrations`)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]schemaRecord{}
	for rows.Next() {
		var k string
		var r schemaRecord
		if err := rows.Scan(&k, &r.name, &r.appliedAt); err != nil {
			tb.Fatal(err)
		}
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// catalogQueries describe every object of the current schema in a form
// that does not depend on OIDs or on the order objects were created in.
var catalogQueries = []string{
	// Relations: tables, indexes, sequences, views.
	`SELECT format('relation %s (kind %s)', c.relname, c.relkind)
	 FROM pg_class AS c WHERE c.relnamespace = current_schema()::regnamespace`,
	// Columns, their types, defaults, nullability and identity.
	`SELECT format('column %s.%s #%s %s%s%s%s', c.relname, a.attname, a.attnum,
	        format_type(a.atttypid, a.atttypmod),
	        CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
	        coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), ''),
	        CASE a.attidentity WHEN 'a' THEN ' generated always as identity'
	                           WHEN 'd' THEN ' generated by default as identity' ELSE '' END)
	 FROM pg_attribute AS a
	 JOIN pg_class AS c ON c.oid = a.attrelid
	 LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'v')
	   AND a.attnum > 0 AND NOT a.attisdropped`,
	`SELECT format('index %s: %s', indexname, indexdef) FROM pg_indexes WHERE schemaname = current_schema()`,
	// Storage parameters (outbox_keys' fillfactor).
	`SELECT format('options %s: %s', relname, reloptions) FROM pg_class
	 WHERE relnamespace = current_schema()::regnamespace AND reloptions IS NOT NULL`,
	`SELECT format('constraint %s on %s: %s', conname, conrelid::regclass, pg_get_constraintdef(oid))
	 FROM pg_constraint WHERE connamespace = current_schema()::regnamespace`,
	`SELECT format('function %s: %s', p.oid::regprocedure, pg_get_functiondef(p.oid))
	 FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace`,
	`SELECT format('trigger %s on %s: %s', t.tgname, t.tgrelid::regclass, pg_get_triggerdef(t.oid))
	 FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
	 WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal`,
	`SELECT format('sequence %s %s start %s by %s min %s max %s cycle %s', sequencename, data_type,
	        start_value, increment_by, min_value, max_value, cycle)
	 FROM pg_sequences WHERE schemaname = current_schema()`,
}

// catalog describes the schema: tables, columns and types, indexes and
// their definitions, storage parameters, constraints, functions, triggers
// and sequences.
func catalog(tb testing.TB, ctx context.Context, pool *pgxpool.Pool) []string {
	tb.Helper()
	var out []string
	for _, q := range catalogQueries {
		rows, err := pool.Query(ctx, q)
		if err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
		out = append(out, lines...)
	}
	slices.Sort(out)
	return out
}

// sameSchema fails tb with the lines each catalog has and the other has not.
func sameSchema(tb testing.TB, got, want []string) {
	tb.Helper()
	var only []string
	for _, l := range got {
		if !slices.Contains(want, l) {
			only = append(only, "only upgraded: "+l)
		}
	}
	for _, l := range want {
		if !slices.Contains(got, l) {
			only = append(only, "only fresh:    "+l)
		}
	}
	if len(only) > 0 {
		tb.Errorf("schema differs from a fresh install's:\n%s", strings.Join(only, "\n"))
	}
	if len(want) < 50 {
		tb.Errorf("a fresh install's catalog has only %d lines: the catalog queries see too little", len(want))
	}
}

// freshCatalog is the catalog of a database installed by this release.
func freshCatalog(tb testing.TB) []string {
	tb.Helper()
	_, pool := testkit.NewDatabasePool(tb, 2)
	ctx := testkit.Context(tb, 30*time.Second)
	if err := migrateAll(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	return catalog(tb, ctx, pool)
}

// TestUpgradeFromEarlierReleases: a database installed by a release that
// knew outbox migrations 1..N (1: before leases; 2: leases without audit;
// 6: 813ffad; 9: 99ac80e, the last before the lease component) is
// brought up to date by this release: the outbox's records stay, each
// lease version is adopted where the outbox had applied its SQL and run
// where not, and the schema equals a fresh install's. A node of the
// previous release (99ac80e) starting afterwards then refuses a newer
// outbox schema and changes nothing.
func TestUpgradeFromEarlierReleases(t *testing.T) {
	t.Parallel()
	want := freshCatalog(t)
	for _, upTo := range []int{1, 2, 6, 9} {
		t.Run(fmt.Sprintf("outbox-v%d", upTo), func(t *testing.T) {
			t.Parallel()
			_, pool := testkit.NewDatabasePool(t, 2)
			ctx := testkit.Context(t, 30*time.Second)
			if err := oldMigrate(ctx, pool, oldOutboxMigrations(t, upTo)); err != nil {
				t.Fatalf("install as the old release: %v", err)
			}
			before := schemaRecords(t, ctx, pool)
			for range 2 {
				if err := migrateAll(ctx, pool); err != nil {
					t.Fatalf("upgrade: %v", err)
				}
			}
			after := schemaRecords(t, ctx, pool)
			checkRecords(t, before, after, upTo)
			sameSchema(t, catalog(t, ctx, pool), want)

			// The previous release knows outbox 1..9: on a newer outbox it
			// refuses to start (nodes already running go on) and changes
			// nothing (docs/design.md, "Rolling upgrade").
			err := oldMigrate(ctx, pool, oldOutboxMigrations(t, 9))
			if newest := outboxVersions(t)[len(outboxVersions(t))-1]; newest > 9 {
				if err == nil || !strings.Contains(err.Error(), "newer than this binary knows") {
					t.Fatalf("the previous release on outbox version %d: %v, want a refusal to start", newest, err)
				}
			} else if err != nil {
				t.Fatalf("the previous release after the upgrade: %v", err)
			}
			if again := schemaRecords(t, ctx, pool); !maps.Equal(again, after) {
				t.Errorf("the previous release changed the records: %v, then %v", after, again)
			}
			sameSchema(t, catalog(t, ctx, pool), want)
		})
	}
}

// checkRecords: every record of the old install is kept as it was; the
// outbox has every version this release ships; lease version v is adopted (recorded with the
// time its SQL was applied as outbox version v+1) iff the old install had
// applied that version, and recorded anew otherwise.
func checkRecords(tb testing.TB, before, after map[string]schemaRecord, oldUpTo int) {
	tb.Helper()
	for k, r := range before {
		if after[k] != r {
			tb.Errorf("schemaRecord %s changed: %+v, then %+v", k, r, after[k])
		}
	}
	wantKeys := []string{"lease/1", "lease/2"}
	for _, v := range outboxVersions(tb) {
		wantKeys = append(wantKeys, "outbox/"+strconv.Itoa(v))
	}
	var gotKeys []string
	for k := range after {
		gotKeys = append(gotKeys, k)
	}
	slices.Sort(wantKeys)
	slices.Sort(gotKeys)
	if !slices.Equal(gotKeys, wantKeys) {
		tb.Errorf("recorded %v, want %v", gotKeys, wantKeys)
	}
	for v, name := range map[int]string{1: "0001_leases.sql", 2: "0002_lease_audit.sql"} {
		got := after["lease/"+strconv.Itoa(v)]
		if got.name != name {
			tb.Errorf("lease/%d recorded as %q, want %q", v, got.name, name)
		}
		former, had := before["outbox/"+strconv.Itoa(v+1)]
		switch {
		case had && got.appliedAt != former.appliedAt:
			tb.Errorf("lease/%d applied at %v, not adopted from outbox/%d (applied at %v)", v, got.appliedAt, v+1, former.appliedAt)
		case !had && v+1 <= oldUpTo:
			tb.Errorf("the old install had no outbox/%d", v+1)
		}
	}
}

// TestUpgradeFrom813ffadKeepsData: a database installed by 813ffad's
// migrations, with pending, published, parked and dead rows, held leases
// and audit rows, is upgraded by several nodes at once: nothing reruns,
// every row is kept, and the schema equals a fresh install's.
func TestUpgradeFrom813ffadKeepsData(t *testing.T) {
	t.Parallel()
	want := freshCatalog(t)
	_, pool := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, 60*time.Second)
	if err := oldMigrate(ctx, pool, oldOutboxMigrations(t, 6)); err != nil {
		t.Fatalf("install as 813ffad: %v", err)
	}
	writeRows(t, ctx, pool)
	tables := []string{"outbox", "ordo_leases", "ordo_lease_audit", "ordo_operator_audit", "ordo_settings"}
	// Each table as its columns were before: columns an upgrade adds are
	// new, and what they hold is checked by their own migrations' tests.
	data, asBefore := map[string]string{}, map[string]string{}
	for _, table := range tables {
		asBefore[table] = columnsNow(t, ctx, pool, table)
		data[table] = dump(t, ctx, pool, asBefore[table])
	}
	keysBefore := dump(t, ctx, pool, "(SELECT correlation_id, last_key_seq FROM outbox_keys)")
	before := schemaRecords(t, ctx, pool)

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = migrateAll(ctx, pool) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent upgrade: %v", err)
		}
	}
	if err := migrateAll(ctx, pool); err != nil {
		t.Fatalf("second upgrade: %v", err)
	}

	checkRecords(t, before, schemaRecords(t, ctx, pool), 6)
	for _, table := range tables {
		if got := dump(t, ctx, pool, asBefore[table]); got != data[table] {
			t.Errorf("%s changed by the upgrade:\nbefore %s\nafter  %s", table, data[table], got)
		}
	}
	if got := dump(t, ctx, pool, "(SELECT correlation_id, last_key_seq FROM outbox_keys)"); got != keysBefore {
		t.Errorf("key counters changed: %s, then %s", keysBefore, got)
	}
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_keys AS k
		WHERE k.partition IS DISTINCT FROM (SELECT o.partition FROM outbox AS o WHERE o.correlation_id = k.correlation_id LIMIT 1)`).
		Scan(&wrong); err != nil || wrong != 0 {
		t.Errorf("%d key counters without their rows' partition (migration 7), err %v", wrong, err)
	}
	sameSchema(t, catalog(t, ctx, pool), want)
}

// writeRows fills an 813ffad install: key a published, parked, pending;
// key b dead (skipped), pending; key c pending; four leases held; an audit
// row of each kind.
func writeRows(tb testing.TB, ctx context.Context, pool *pgxpool.Pool) {
	tb.Helper()
	for _, k := range []string{"a", "a", "a", "b", "b", "c"} {
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
			VALUES (gen_random_uuid(), $1, $2, 'ex', 'rk', 't.v1', '{"n":1}')`, partition.Of(k, partitions), k); err != nil {
			tb.Fatal(err)
		}
	}
	for _, q := range []string{
		`UPDATE outbox SET processed_at = clock_timestamp() WHERE correlation_id = 'a' AND key_seq = 1`,
		`UPDATE outbox SET attempts = 5, last_error = 'no route', parked_at = clock_timestamp(),
			next_attempt_at = clock_timestamp() WHERE correlation_id = 'a' AND key_seq = 2`,
		`UPDATE outbox SET dead_at = clock_timestamp(), processed_at = clock_timestamp()
			WHERE correlation_id = 'b' AND key_seq = 1`,
		`UPDATE ordo_leases SET owner = 'n1', epoch = 3, expires_at = clock_timestamp() + interval '1 hour',
			claimed_at = clock_timestamp() WHERE partition < 4`,
		`INSERT INTO ordo_lease_audit (node, partition, epoch, event, detail)
			VALUES ('n1', 0, 3, 'claim', NULL), ('n2', 1, 2, 'refused-write', 'mark')`,
		`INSERT INTO ordo_operator_audit (operator, remote_addr, action, target, result)
			VALUES ('op', '127.0.0.1', 'skip', 'message', 'skipped')`,
	} {
		if tag, err := pool.Exec(ctx, q); err != nil || tag.RowsAffected() == 0 {
			tb.Fatalf("%s: %v (%d rows)", q, err, tag.RowsAffected())
		}
	}
}

// dump returns every row of table (a name or a parenthesised query) as
// text, in a stable order.
// columnsNow returns a query of table's columns as they are now, in
// their order, for dump.
func columnsNow(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, table string) string {
	tb.Helper()
	var cols string
	if err := pool.QueryRow(ctx, `SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, table).Scan(&cols); err != nil {
		tb.Fatalf("columns of %s: %v", table, err)
	}
	return "(SELECT " + cols + " FROM " + table + ")"
}

func dump(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, table string) string {
	tb.Helper()
	var s string
	if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(t::text, ' | ' ORDER BY t::text), '') FROM `+table+` AS t`).
		Scan(&s); err != nil {
		tb.Fatalf("dump %s: %v", table, err)
	}
	if s == "" {
		tb.Fatalf("dump %s: no rows", table)
	}
	return s
}

// TestMigrateConcurrentAndIdempotent: nodes starting at once on an empty
// database, some applying the lease migrations before the outbox's, all
// succeed; migrating again changes nothing; the result is a fresh
// install's schema, with one lease row per partition.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	want := freshCatalog(t)
	_, pool := testkit.NewDatabasePool(t, 6)
	ctx := testkit.Context(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			if i%2 == 1 {
				if errs[i] = lease.Migrate(ctx, pool, partitions); errs[i] != nil {
					return
				}
			}
			errs[i] = migrateAll(ctx, pool)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	first := schemaRecords(t, ctx, pool)
	if err := migrateAll(ctx, pool); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	checkRecords(t, nil, schemaRecords(t, ctx, pool), 0)
	if again := schemaRecords(t, ctx, pool); !maps.Equal(again, first) {
		t.Errorf("migrating again changed the records: %v, then %v", first, again)
	}
	var rows, top int
	if err := pool.QueryRow(ctx, `SELECT count(*), max(partition) FROM ordo_leases`).Scan(&rows, &top); err != nil ||
		rows != partitions || top != partitions-1 {
		t.Errorf("lease rows: %d up to %d (%v), want %d up to %d", rows, top, err, partitions, partitions-1)
	}
	sameSchema(t, catalog(t, ctx, pool), want)
}

// TestDocsHoldLeaseDDL keeps docs/outbox-table.md exact: it holds every
// lease migration verbatim, as it does the outbox's.
func TestDocsHoldLeaseDDL(t *testing.T) {
	doc, err := os.ReadFile("../docs/outbox-table.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), strings.TrimSpace(string(b))) {
			t.Errorf("docs/outbox-table.md does not hold lease/%s verbatim; paste it in", f)
		}
	}
}
