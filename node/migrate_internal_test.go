package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
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
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := fatalMigrateError(c.err); got != c.fatal {
				t.Fatalf("fatalMigrateError(%v) = %v, want %v", c.err, got, c.fatal)
			}
		})
	}
}
