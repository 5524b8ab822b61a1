package inbox

import (
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/wire"
)

// TestGapStoredDuringSkipIsDue: a message stored behind its key's dead
// message while an operator's Skip of that message is under way (the
// Skip found nothing stored to make due) is due once the Skip commits,
// not never. The store reads the key's row FOR SHARE: it waits for the
// Skip, then reads the key past the skipped message. Without that, the
// message was stored due never and its key stopped for good (the
// shipping admin test's "poison-2 dead at key_seq 2: not within 30s").
func TestGapStoredDuringSkipIsDue(t *testing.T) {
	testkit.RequirePostgres(t)
	_, pool := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, 30*time.Second)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cfg := LocalConfig(testkit.UniqueName(t, "skip"))
	s, err := NewStore(cfg, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := wire.DefaultSource
	msg := func(seq int64) Message {
		return Message{ID: "m" + string(rune('0'+seq)), CorrelationID: "k", KeySeq: seq, PrevKeySeq: seq - 1, Source: src, Body: []byte(`{}`)}
	}
	if err := s.store(ctx, pool, Fence{}, &storedMessage{Message: msg(1), held: "poison"}, nil); err != nil {
		t.Fatal(err)
	}

	// The Skip, open: the key row locked, the dead message gone, the key
	// moved past it, and no later message stored to make due.
	skip, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer skip.Rollback(ctx)
	var seq *int64
	if _, err := skip.Exec(ctx, sqlSkipLock, cfg.Name, "k", src); err != nil {
		t.Fatal(err)
	}
	if err := skip.QueryRow(ctx, sqlSkipDead, cfg.Name, "k", src).Scan(&seq); err != nil || seq == nil || *seq != 1 {
		t.Fatalf("skip dropped %v (%v), want key_seq 1", seq, err)
	}
	if tag, err := skip.Exec(ctx, sqlSkipAdvance, cfg.Name, "k", src, *seq); err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("skip advance: %v, %d later messages made due, want none stored yet", err, tag.RowsAffected())
	}

	// Key_seq 2 arrives and is stored as a gap (due when its predecessor
	// is handled) while the Skip is open.
	stored := make(chan error, 1)
	go func() {
		stored <- s.store(ctx, pool, Fence{}, &storedMessage{Message: msg(2)}, nil)
	}()
	// Either the store waits for the Skip's lock on the key, or it has
	// finished without waiting.
	var early error
	finished := false
	testkit.WaitFor(t, 10*time.Second, "the store waiting for the Skip, or done", func() bool {
		select {
		case early = <-stored:
			finished = true
			return true
		default:
		}
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO ordo_inbox_messages%')`).Scan(&waiting)
		return err == nil && waiting
	})
	if err := skip.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !finished {
		early = <-stored
	}
	if early != nil {
		t.Fatal(early)
	}
	var due bool
	if err := pool.QueryRow(ctx, `SELECT next_attempt_at <= now() FROM ordo_inbox_messages
		WHERE consumer = $1 AND correlation_id = 'k' AND key_seq = 2`, cfg.Name).Scan(&due); err != nil || !due {
		t.Fatalf("key_seq 2 stored during the Skip: due %v (%v); want due now, the key being past key_seq 1", due, err)
	}
}
