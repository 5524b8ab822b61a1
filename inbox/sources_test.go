package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/wire"
)

// sourceHandler records each message in the handled table under the key
// "source/correlation id".
func sourceHandler(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO handled (key, seq) VALUES ($1, $2)`, m.Source+"/"+m.CorrelationID, m.KeySeq)
	return err
}

// sourceHeaders are the Ordo headers of key_seq seq (prev seq-1) in
// partition 3, with x-ordo-source = source unless source is "".
func sourceHeaders(source string, seq int64) amqp.Table {
	h := amqp.Table{wire.HeaderKeySeq: seq, wire.HeaderPrevKeySeq: seq - 1, wire.HeaderPartition: int32(3)}
	if source != "" {
		h[wire.HeaderSource] = source
	}
	return h
}

// TestTwoSourcesSameKeyAreTwoKeys: the same correlation id from two
// sources is two keys, each handled in its own key_seq order, with no
// duplicate dropped across them, through a running consumer (the broker,
// FromDelivery, the lanes and the Store). A message without
// x-ordo-source and one with "default" are the same source. An invalid
// source name is dead-lettered as an invalid message.
func TestTwoSourcesSameKeyAreTwoKeys(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	r := startConsumer(t, cfg, "a", pool, sourceHandler)
	testkit.WaitFor(t, 30*time.Second, "shards owned", func() bool { return len(r.c.Owned()) == 2 })
	pub := newPublisher(t, cfg.Exchange)
	for _, m := range []struct {
		source string
		seq    int64
	}{
		{"", 1}, {"", 2}, {"billing", 1}, {"default", 3}, {"billing", 2}, {"billing", 3}, {"", 4},
	} {
		pub.publishRaw("k", sourceHeaders(m.source, m.seq), fmt.Sprintf("%s-k-%d", m.source, m.seq))
	}
	pub.publishRaw("k", sourceHeaders("Billing!", 1), "bad-source")
	want := map[string]int64{"default/k": 4, "billing/k": 3}
	waitHandled(t, pool, want)
	testkit.WaitFor(t, 30*time.Second, "1 dead letter", func() bool { return queueDepth(t, r.c.Topology().DeadQueue()) == 1 })
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	if st := r.c.Stats(); st.Invalid != 1 || st.Duplicates != 0 {
		t.Fatalf("stats %+v, want 1 invalid and no duplicate", st)
	}
}

// TestTwoSourcesStore is the same at the Store: a gap in one source's key
// is not filled by the other source's message of the same key_seq, and a
// key's state in one source does not make the other's messages
// duplicates.
func TestTwoSourcesStore(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	in := func(source string, seq int64) *inbox.Message {
		m := msg("k", seq, 3)
		m.Source = source
		return m
	}
	for _, st := range []struct {
		m    *inbox.Message
		want inbox.Outcome
	}{
		{in("default", 1), inbox.Handled},
		{in("billing", 2), inbox.Stored}, // billing's k has handled nothing: a gap
		{in("default", 2), inbox.Handled},
		{in("billing", 1), inbox.Handled}, // fills billing's gap; billing k/2 follows
		{in("", 3), inbox.Handled},        // "" is default
		{in("billing", 3), inbox.Handled},
		{in("billing", 2), inbox.Duplicate},
	} {
		if got := handle(t, s, inbox.Fence{}, st.m, sourceHandler); got != st.want {
			t.Fatalf("%s k/%d: %v, want %v", st.m.Source, st.m.KeySeq, got, st.want)
		}
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"default/k": 3, "billing/k": 3})
}

// TestFromDeliverySource: the source is the header's, default when absent;
// an invalid one makes the message invalid.
func TestFromDeliverySource(t *testing.T) {
	for _, tc := range []struct {
		name   string
		source any
		want   string
		err    error
	}{
		{"absent", nil, wire.DefaultSource, nil},
		{"named", "billing", "billing", nil},
		{"bytes", []byte("billing"), "billing", nil},
		{"upper case", "Billing", "", wire.ErrInvalidSource},
		{"empty", "", "", wire.ErrInvalidSource},
		{"a number", int32(7), "", wire.ErrNotString},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]any{wire.HeaderKeySeq: int64(1), wire.HeaderPrevKeySeq: int64(0), wire.HeaderPartition: int32(0)}
			if tc.source != nil {
				h[wire.HeaderSource] = tc.source
			}
			m, err := inbox.FromDelivery(deliveryOf("k", h))
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !errors.Is(err, inbox.ErrInvalidMessage) {
					t.Fatalf("FromDelivery: %v, want %v and ErrInvalidMessage", err, tc.err)
				}
				return
			}
			if err != nil || m.Source != tc.want {
				t.Fatalf("FromDelivery: %+v, %v; want source %q", m, err, tc.want)
			}
		})
	}
}

// TestOperatorActionsNameTheSource: Resolve, Retry and Skip act on the
// key of the source they name, and the audit records it.
func TestOperatorActionsNameTheSource(t *testing.T) {
	_, pool := newDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	for _, source := range []string{"default", "billing"} {
		m := msg("k", 3, 0) // a gap: k/1 and k/2 missing
		m.Source = source
		handle(t, s, inbox.Fence{}, m, sourceHandler)
	}
	stuck, err := inbox.Stuck(ctx, pool, "t", 0)
	if err != nil || len(stuck) != 2 || stuck[0].Source == stuck[1].Source {
		t.Fatalf("Stuck = %+v, %v; want k stuck in billing and default", stuck, err)
	}
	who := inbox.Actor{Operator: "op", RemoteAddr: "cli"}
	if err := inbox.Act(ctx, pool, who, inbox.ActionResolve, "t", "billing", "k"); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Act(ctx, pool, who, inbox.ActionResolve, "t", "billing", "k"); !errors.Is(err, inbox.ErrNothingToResolve) {
		t.Fatalf("second resolve of billing/k: %v, want ErrNothingToResolve", err)
	}
	if err := inbox.Resolve(ctx, pool, "t", "Bad", "k"); !errors.Is(err, wire.ErrInvalidSource) {
		t.Fatalf("resolve with an invalid source: %v, want ErrInvalidSource", err)
	}
	stuck, err = inbox.Stuck(ctx, pool, "t", 0)
	if err != nil || len(stuck) != 1 || stuck[0].Source != "default" {
		t.Fatalf("after resolving billing/k: Stuck = %+v, %v; want default/k only", stuck, err)
	}
	audit, err := inbox.Audit(ctx, pool, "t", 10)
	if err != nil || len(audit) != 2 || audit[0].Source != "billing" || audit[1].Source != "billing" {
		t.Fatalf("Audit = %+v, %v; want two billing entries", audit, err)
	}
}

// TestUpgradeToSources installs the inbox schema as the release before
// sources left it (migrations 0001-0002) with a key and a stored gap,
// migrates, and checks that both became the source default and that a
// message without x-ordo-source continues the key at its next key_seq;
// then that the previous release's inserts still work and mean default.
func TestUpgradeToSources(t *testing.T) {
	_, pool := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, 30*time.Second)
	installBeforeSources(t, ctx, pool)
	for _, sql := range []string{
		`CREATE TABLE handled (n bigserial PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, instance text NOT NULL DEFAULT '')`,
		`INSERT INTO ordo_inbox_keys (consumer, correlation_id, last_seq, last_message_id) VALUES ('t', 'k', 2, 'k-2')`,
		`INSERT INTO ordo_inbox_messages (consumer, correlation_id, key_seq, prev_seq, partition, shard, message_id,
		     type, exchange, routing_key, headers, body)
		 VALUES ('t', 'k', 4, 3, 0, 0, 'k-4', 't', 'ex', 'rk', '{}', '\x7b7d')`,
		`INSERT INTO ordo_inbox_audit (consumer, operator, remote_addr, action, key, result) VALUES ('t', 'op', 'cli', 'retry', 'k', 'done')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var sources string
	if err := pool.QueryRow(ctx, `SELECT (SELECT string_agg(source, ',') FROM ordo_inbox_keys) || ';' ||
		(SELECT string_agg(source, ',') FROM ordo_inbox_messages) || ';' || (SELECT string_agg(source, ',') FROM ordo_inbox_audit)`).
		Scan(&sources); err != nil {
		t.Fatal(err)
	}
	if sources != "default;default;default" {
		t.Fatalf("sources after the upgrade (keys;messages;audit) = %q, want every row default", sources)
	}

	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	deliver := func(source string, seq int64) inbox.Outcome {
		m, err := inbox.FromDelivery(deliveryOf("k", sourceHeaders(source, seq)))
		if err != nil {
			t.Fatal(err)
		}
		return handle(t, s, inbox.Fence{}, m, sourceHandler)
	}
	if out := deliver("", 2); out != inbox.Duplicate {
		t.Fatalf("k/2 after the upgrade: %v, want duplicate (the key was at 2)", out)
	}
	if out := deliver("", 3); out != inbox.Handled {
		t.Fatalf("k/3 after the upgrade: %v, want handled", out)
	}
	if out := deliver("billing", 1); out != inbox.Handled {
		t.Fatalf("billing k/1: %v, want handled (a new key)", out)
	}
	got := handledSeqs(t, pool)
	if !equal(got["default/k"], []int64{3, 4}) || !equal(got["billing/k"], []int64{1}) || len(got) != 2 {
		t.Fatalf("handled %v, want default/k 3 then the stored 4, and billing/k 1", got)
	}
	if audit, err := inbox.Audit(ctx, pool, "t", 10); err != nil || len(audit) != 1 || audit[0].Source != "default" || audit[0].Key != "k" {
		t.Fatalf("audit after the upgrade: %+v, %v", audit, err)
	}

	// An instance of the previous release, still running during the
	// rolling upgrade, writes without a source: its rows are default's.
	for _, sql := range []string{
		`INSERT INTO ordo_inbox_keys (consumer, correlation_id, last_seq) VALUES ('t', 'old', 1) ON CONFLICT DO NOTHING`,
		`INSERT INTO ordo_inbox_keys (consumer, correlation_id, last_seq) VALUES ('t', 'k', 0) ON CONFLICT DO NOTHING`,
		`INSERT INTO ordo_inbox_retention AS r (consumer, low_water) VALUES ('t', now() - interval '1 day')
		 ON CONFLICT (consumer) DO UPDATE SET low_water = greatest(r.low_water, excluded.low_water)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("the previous release's %s: %v", sql, err)
		}
	}
	m, err := inbox.FromDelivery(deliveryOf("old", sourceHeaders("", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if out := handle(t, s, inbox.Fence{}, m, sourceHandler); out != inbox.Handled {
		t.Fatalf("old/2 after the previous release created old at 1: %v, want handled", out)
	}
}

// installBeforeSources applies the inbox's migrations 0001 and 0002 only,
// as the release before sources did.
func installBeforeSources(tb testing.TB, ctx context.Context, pool *pgxpool.Pool) {
	tb.Helper()
	old := fstest.MapFS{}
	for _, name := range []string{"0001_inbox.sql", "0002_inbox_audit.sql"} {
		b, err := os.ReadFile("migrations/" + name)
		if err != nil {
			tb.Fatal(err)
		}
		old["migrations/"+name] = &fstest.MapFile{Data: b}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "inbox", old, "migrations")
	}); err != nil {
		tb.Fatal(err)
	}
}
