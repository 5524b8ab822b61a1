package main

import (
	"bytes"
	stdctx "context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
)

// TestDropKeySeqTriggerCommand drives "node drop-key-seq-trigger"
// against a real database: it refuses, naming the node, while a node
// that holds a lease has not recorded that it numbers rows; -check says
// so and drops nothing; with a producer's transaction open on the outbox
// it gives up after -lock-timeout instead of queueing every insert
// behind it; once every lease holder numbers rows it drops the trigger,
// and a second run finds nothing to do.
func TestDropKeySeqTriggerCommand(t *testing.T) {
	testkit.RequirePostgres(t)
	url, pool := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, 60*time.Second)
	if err := outbox.Migrate(ctx, pool, 8); err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(ctx, pool, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE ordo_leases SET owner = CASE WHEN partition < 4 THEN 'old-1' ELSE 'new-1' END,
		epoch = 1, expires_at = clock_timestamp() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO ordo_numbering_nodes (node) VALUES ('new-1')`); err != nil {
		t.Fatal(err)
	}
	run := func(want int, args ...string) (stdout, stderr string) {
		t.Helper()
		var out, errOut bytes.Buffer
		status := runCommand(&out, &errOut, append([]string{"drop-key-seq-trigger", "-postgres-url", url}, args...)...)
		if status != want {
			t.Fatalf("node drop-key-seq-trigger %v: exit status %d, want %d; stdout %q, stderr %q", args, status, want, out.String(), errOut.String())
		}
		return out.String(), errOut.String()
	}
	installed := func() bool {
		t.Helper()
		on, err := outbox.KeySeqTriggerInstalled(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}

	_, stderr := run(1)
	if !strings.Contains(stderr, outbox.ErrOldNodesRunning.Error()+": old-1 ") || strings.Contains(stderr, "new-1") {
		t.Fatalf("refusal %q: want it to name old-1 alone", stderr)
	}
	stdout, _ := run(0, "-check")
	if !strings.Contains(stdout, "must stay") || !strings.Contains(stdout, "old-1") || strings.Contains(stdout, "new-1") {
		t.Fatalf("-check said %q: want the trigger needed by old-1", stdout)
	}
	if !installed() {
		t.Fatal("the trigger is gone after a refusal and a -check")
	}

	if _, err := pool.Exec(ctx, `INSERT INTO ordo_numbering_nodes (node) VALUES ('old-1')`); err != nil {
		t.Fatal(err)
	}
	if stdout, _ := run(0, "-check"); !strings.Contains(stdout, "can be dropped") {
		t.Fatalf("-check said %q once every lease holder numbers rows", stdout)
	}
	producer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Before the database is dropped, whatever happens.
	t.Cleanup(func() { _ = producer.Rollback(stdctx.Background()) })
	if _, err := producer.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		VALUES ($1, 1, 'k', 'ex', 'rk', 't', '{}')`, uuid.Must(uuid.NewV7())); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, stderr = run(1, "-lock-timeout", "300ms")
	if !strings.Contains(stderr, "stayed locked") || time.Since(began) > 8*time.Second {
		t.Fatalf("with a producer's transaction open: %q after %v; want a lock timeout", stderr, time.Since(began))
	}
	if err := producer.Rollback(stdctx.Background()); err != nil {
		t.Fatal(err)
	}
	if !installed() {
		t.Fatal("the trigger is gone after a lock timeout")
	}

	if stdout, _ := run(0); !strings.Contains(stdout, "dropped the key_seq trigger") {
		t.Fatalf("drop said %q", stdout)
	}
	if installed() {
		t.Fatal("the trigger is still installed after the drop")
	}
	if stdout, _ := run(0); !strings.Contains(stdout, "not installed") {
		t.Fatalf("a second drop said %q", stdout)
	}
}
