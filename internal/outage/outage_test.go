package outage

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func TestOneLinePerOutage(t *testing.T) {
	rec := &recorder{}
	o := New(slog.New(rec), "db")
	o.Remind = 50 * time.Millisecond
	for range 1000 {
		o.Fail(errors.New("refused"))
	}
	if !o.Down() || len(rec.msgs) != 1 || rec.msgs[0] != "WARN db unavailable" {
		t.Fatalf("after 1000 failures: %q", rec.msgs)
	}
	time.Sleep(60 * time.Millisecond) // let the reminder interval pass
	o.Fail(errors.New("refused"))
	o.Fail(errors.New("refused"))
	o.OK()
	o.OK()
	want := []string{"WARN db unavailable", "WARN db still unavailable", "INFO db available again"}
	if len(rec.msgs) != len(want) {
		t.Fatalf("log %q, want %q", rec.msgs, want)
	}
	for i := range want {
		if rec.msgs[i] != want[i] {
			t.Fatalf("log %q, want %q", rec.msgs, want)
		}
	}
	if o.Down() {
		t.Fatal("still down after OK")
	}
}
