package backoff

import (
	"context"
	"testing"
	"time"
)

func TestBackoffDoublesCapsAndResets(t *testing.T) {
	b := New(10*time.Millisecond, 80*time.Millisecond)
	for i, hi := range []time.Duration{10, 20, 40, 80, 80, 80} {
		d := b.Next()
		hi *= time.Millisecond
		if d < hi/2 || d > hi {
			t.Fatalf("wait %d: %v, want in [%v, %v]", i, d, hi/2, hi)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("after Reset: %v, want at most 10ms", d)
	}
}

func TestAttempt(t *testing.T) {
	for _, tc := range []struct {
		n      int
		lo, hi time.Duration
	}{{0, 100, 100}, {1, 200, 200}, {3, 800, 800}, {10, 1000, 1000}} {
		d := Attempt(tc.n, 100*time.Millisecond, time.Second)
		lo, hi := tc.lo*time.Millisecond/2, tc.hi*time.Millisecond
		if d < lo || d > hi {
			t.Fatalf("Attempt(%d) = %v, want in [%v, %v]", tc.n, d, lo, hi)
		}
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep reported the hour passed on a cancelled context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep of 1ms did not pass")
	}
}

func TestDoubled(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, time.Second}, {1, 2 * time.Second}, {3, 8 * time.Second}, {4, 10 * time.Second}, {40, 10 * time.Second}} {
		if got := Doubled(c.n, time.Second, 10*time.Second); got != c.want {
			t.Errorf("Doubled(%d, 1s, 10s) = %v, want %v", c.n, got, c.want)
		}
	}
}
