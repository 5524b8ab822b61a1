package harness

import (
	"context"
	"testing"
)

// TestNewFailsCleanly: a rig whose database cannot be created returns the
// error (it once panicked in its own cleanup).
func TestNewFailsCleanly(t *testing.T) {
	cfg := Config{PostgresURL: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"}
	r, err := New(context.Background(), cfg, "unreachable", 1)
	if err == nil || r != nil {
		t.Fatalf("New = %v, %v; want an error", r, err)
	}
}
