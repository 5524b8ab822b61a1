package inboxfaults

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
)

// TestFaultsWrap: each fault comes after the projection ran (its writes
// queued, for a QueueHandler), once per attempt, both ways.
func TestFaultsWrap(t *testing.T) {
	calls := 0
	h := func(context.Context, pgx.Tx, *inbox.Message) error { calls++; return nil }
	q := func(_ context.Context, _ *inbox.Message, b *pgx.Batch) error {
		calls++
		b.Queue("SELECT 1")
		return nil
	}
	msg := &inbox.Message{CorrelationID: "order-1", KeySeq: 1}
	run := func(f Config, queued bool) (err error, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		if queued {
			b := &pgx.Batch{}
			_, wrapped := f.WrapQueue(nil, q, nil)
			err = wrapped(context.Background(), msg, b)
			if b.Len() != 1 {
				t.Fatalf("%d statements queued, want the projection's one", b.Len())
			}
			return err, false
		}
		_, wrapped := f.Wrap(nil, h, nil)
		return wrapped(context.Background(), nil, msg), false
	}
	for _, tc := range []struct {
		name      string
		f         Config
		wantErr   error
		wantPanic bool
	}{
		{name: "none", f: Config{}},
		{name: "errors", f: Config{ErrorRate: 1}, wantErr: ErrInjected},
		{name: "panics", f: Config{PanicRate: 1}, wantPanic: true},
		{name: "poison", f: Config{PoisonPrefix: "order-"}, wantErr: ErrPoison},
		{name: "other orders are not poison", f: Config{PoisonPrefix: "poison-"}},
	} {
		for _, queued := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/queued=%v", tc.name, queued), func(t *testing.T) {
				before := calls
				err, panicked := run(tc.f, queued)
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || panicked != tc.wantPanic {
					t.Fatalf("err %v panicked %v; want %v, panic %v", err, panicked, tc.wantErr, tc.wantPanic)
				}
				if calls != before+1 {
					t.Fatalf("the projection ran %d times, want once (the fault comes after its writes)", calls-before)
				}
			})
		}
	}
}

// TestFlags: the flags set the Config, and Validate refuses shares it
// cannot inject.
func TestFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.AddFlags(fs)
	if err := fs.Parse([]string{"-fault-error-rate", "0.03", "-fault-panic-rate", "0.02", "-fault-poison-prefix", "p-",
		"-handler-delay", "100ms", "-kill-after", "15"}); err != nil {
		t.Fatal(err)
	}
	if want := (Config{ErrorRate: 0.03, PanicRate: 0.02, PoisonPrefix: "p-", HandlerDelay: 100 * time.Millisecond, KillAfter: 15}); c != want {
		t.Fatalf("config %+v, want %+v", c, want)
	}
	for _, bad := range []Config{{ErrorRate: -0.1}, {ErrorRate: 0.6, PanicRate: 0.6}, {HandlerDelay: -time.Second}, {KillAfter: -1}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestWrapDelaysAndKills: HandlerDelay makes each attempt wait before the
// handler runs; nothing injected leaves the database and the handler as
// they are; KillAfter wraps the database.
func TestWrapDelaysAndKills(t *testing.T) {
	ran := false
	h := func(context.Context, pgx.Tx, *inbox.Message) error { ran = true; return nil }
	start := time.Now()
	_, d := Config{HandlerDelay: 50 * time.Millisecond}.Wrap(nil, h, nil)
	if err := d(context.Background(), nil, &inbox.Message{}); err != nil || !ran || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("delayed attempt: err %v, ran %v after %v", err, ran, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran = false
	_, d = Config{HandlerDelay: time.Hour}.Wrap(nil, h, nil)
	if err := d(ctx, nil, &inbox.Message{}); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("a cancelled delayed attempt: err %v, ran %v", err, ran)
	}
	if db, _ := (Config{KillAfter: 3}).Wrap(nil, h, nil); db == nil {
		t.Fatal("KillAfter left the database unwrapped")
	}
	q := func(context.Context, *inbox.Message, *pgx.Batch) error { ran = true; return nil }
	if db, _ := (Config{KillAfter: 3}).WrapQueue(nil, q, nil); db == nil {
		t.Fatal("KillAfter left the database of a QueueHandler unwrapped")
	}
	ran = false
	start = time.Now()
	_, dq := Config{HandlerDelay: 50 * time.Millisecond}.WrapQueue(nil, q, nil)
	if err := dq(context.Background(), &inbox.Message{}, &pgx.Batch{}); err != nil || !ran || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("delayed queued attempt: err %v, ran %v after %v", err, ran, time.Since(start))
	}
	if db, _ := (Config{}).Wrap(nil, h, nil); db != nil {
		t.Fatalf("nothing injected, yet the database became %T", db)
	}
}
