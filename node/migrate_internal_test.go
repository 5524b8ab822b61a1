package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// TestFatalMigrateError: the migration errors that stop the node (a
// partition mismatch, a newer schema, a refused login, no such database,
// a refused statement) and those tried again (no connection, a timeout,
// a server starting, shutting down or full, a serialization failure).
func TestFatalMigrateError(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("migrate: %w", &pgconn.PgError{Code: code}) }
	for _, c := range []struct {
		name  string
		err   error
		fatal bool
	}{
		{"partition mismatch", fmt.Errorf("x: %w", &outbox.PartitionMismatchError{Installed: 4, Configured: 8}), true},
		{"newer schema", fmt.Errorf("outbox schema version 9 is newer than this binary knows (5): %w", pgmigrate.ErrNewerSchema), true},
		{"wrong password", pg("28P01"), true},
		{"no pg_hba entry", pg("28000"), true},
		{"no such database", pg("3D000"), true},
		{"no privilege", pg("42501"), true},
		{"object in the way", pg("42P07"), true},
		{"connection refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, false},
		{"timeout", context.DeadlineExceeded, false},
		{"server starting", pg("57P03"), false},
		{"admin shutdown", pg("57P01"), false},
		{"too many connections", pg("53300"), false},
		{"serialization failure", pg("40001"), false},
		{"lock timeout", pg("55P03"), false},
		{"statement timeout", pg("57014"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := fatalMigrateError(c.err); got != c.fatal {
				t.Fatalf("fatalMigrateError(%v) = %v, want %v", c.err, got, c.fatal)
			}
		})
	}
}

// TestMigrateAttemptBoundedOnStalledLink: a migration attempt whose link
// stalls after the connect (here while it waits for the migration lock
// another session holds, so that the stall surely comes after the
// connect) ends at its bound with an error tried again, rather than
// waiting for TCP keepalive; once the link answers again the next
// attempt migrates.
func TestMigrateAttemptBoundedOnStalledLink(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	proxy := testkit.NewProxy(t, testkit.HostPort(t, dbURL))
	cc, err := pgx.ParseConfig(proxy.URL(dbURL))
	if err != nil {
		t.Fatal(err)
	}
	app := fmt.Sprintf("ordo-stall-%d", time.Now().UnixNano())
	cc.RuntimeParams["application_name"] = app
	s := &source{name: "default", leaseConn: cc, partitions: 4, migrateMax: 8 * time.Second}
	ctx := testkit.Context(t, 60*time.Second)

	// Another session holds the migration lock, so the attempt waits on it.
	tx := holdMigrationLock(ctx, t, dbURL)

	// A third session watches (pg_stat_activity is a snapshot for the
	// rest of a transaction, such as the holder's).
	watcher, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(context.Background())

	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- s.migrate(ctx) }()
	testkit.WaitFor(t, 30*time.Second, "the attempt waiting for the migration lock", func() bool {
		var n int
		err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
		return err == nil && n > 0
	})
	proxy.Stall()
	if err := tx.Rollback(ctx); err != nil { // the server runs the migration; its replies are held
		t.Fatal(err)
	}
	select {
	case err := <-done:
		took := time.Since(began)
		if err == nil {
			t.Fatal("the attempt migrated through a stalled link")
		}
		if fatalMigrateError(err) {
			t.Fatalf("a stalled attempt failed for good: %v", err)
		}
		t.Logf("the stalled attempt ended after %v: %v", took, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled attempt did not end within 20s (its bound is 8s)")
	}
	proxy.Resume()
	if err := s.migrate(ctx); err != nil {
		t.Fatalf("the attempt after the link answered again: %v", err)
	}
}

// TestMigrateLockWaitBounded: an attempt that waits for the migration
// lock, held by another session that does not let go, gives up after
// pgmigrate.LockTimeout with an error tried again (55P03), instead of
// waiting without a log line.
func TestMigrateLockWaitBounded(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	cc, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	s := &source{name: "default", leaseConn: cc, partitions: 4}
	ctx := testkit.Context(t, 60*time.Second)
	holdMigrationLock(ctx, t, dbURL)
	began := time.Now()
	err = s.migrate(ctx)
	took := time.Since(began)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("migrate while the lock is held: %v after %v, want SQLSTATE 55P03", err, took)
	}
	if fatalMigrateError(err) {
		t.Fatalf("a lock timeout is taken as fatal: %v", err)
	}
	if took < pgmigrate.LockTimeout-time.Second || took > pgmigrate.LockTimeout+15*time.Second {
		t.Fatalf("gave up after %v, want about %v", took, pgmigrate.LockTimeout)
	}
	t.Logf("gave up after %v: %v", took, err)
}

// TestTwoSourcesOneDatabaseRefused: two sources whose URLs differ (one
// through 127.0.0.1, one through localhost) but reach one database stop
// the node, naming both; two databases on one server do not.
func TestTwoSourcesOneDatabaseRefused(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	other := testkit.NewDatabase(t)
	src := func(name, rawURL string) *source {
		cc, err := pgx.ParseConfig(rawURL)
		if err != nil {
			t.Fatal(err)
		}
		return &source{name: name, leaseConn: cc, partitions: 4, migrated: make(chan struct{}),
			explicit: true, logger: testkit.Logger(t, slog.LevelWarn)}
	}
	viaLocalhost := strings.Replace(dbURL, "127.0.0.1", "localhost", 1)
	if viaLocalhost == dbURL {
		t.Fatalf("test database URL %q does not name 127.0.0.1", dbURL)
	}

	t.Run("one database", func(t *testing.T) {
		m := startMigrations(testkit.Context(t, 60*time.Second), []*source{src("default", dbURL), src("billing", viaLocalhost)})
		defer m.stop()
		select {
		case <-m.failed:
		case <-time.After(30 * time.Second):
			t.Fatal("the node did not refuse two sources on one database within 30s")
		}
		err := m.err()
		if !errors.Is(err, ErrSameDatabase) || !strings.Contains(err.Error(), "default") || !strings.Contains(err.Error(), "billing") {
			t.Fatalf("error %v: want ErrSameDatabase naming default and billing", err)
		}
		t.Logf("refused: %v", err)
	})
	t.Run("two databases", func(t *testing.T) {
		a, b := src("default", dbURL), src("billing", other)
		m := startMigrations(testkit.Context(t, 60*time.Second), []*source{a, b})
		defer m.stop()
		for _, s := range []*source{a, b} {
			select {
			case <-s.migrated:
			case <-m.failed:
				t.Fatalf("two databases refused: %v", m.err())
			case <-time.After(30 * time.Second):
				t.Fatalf("source %s not migrated within 30s", s.name)
			}
		}
	})
}

// holdMigrationLock takes the migration lock on a session of its own, in
// a transaction left open until the test ends (or the caller rolls it
// back), and returns that transaction.
func holdMigrationLock(ctx context.Context, t *testing.T, dbURL string) pgx.Tx {
	t.Helper()
	holder, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if err := pgmigrate.Lock(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return tx
}
