package testkit

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Poll bounds for WaitFor: it polls every waitPollMin at first, doubling up
// to waitPollMax.
const (
	waitPollMin = time.Millisecond
	waitPollMax = 25 * time.Millisecond
)

// WaitFor polls cond until it returns true, logs how long that took and
// returns it. When timeout passes first it fails tb with "<what>: not
// within <timeout>". It polls often at first (every millisecond, doubling
// to 25 ms), so a condition that is soon true costs little wall time and
// one that takes seconds little CPU. cond runs on the caller's goroutine.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	poll := waitPollMin
	for !cond() {
		if time.Since(start) > timeout {
			tb.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(poll)
		poll = min(2*poll, waitPollMax)
	}
	took := time.Since(start)
	tb.Logf("%s after %v", what, took.Round(time.Millisecond))
	return took
}

// Logger returns a logger that writes each record through tb.Log, at level
// and above; with ORDO_TEST_DEBUG set in the environment, at debug and
// above. Records logged once tb's cleanups have run (by a goroutine the
// test did not wait for) are dropped: testing panics on a Log after the
// test ended. Loggers are safe for concurrent use.
func Logger(tb testing.TB, level slog.Level) *slog.Logger {
	if os.Getenv("ORDO_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	w := &tbWriter{tb: tb}
	tb.Cleanup(w.end)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// tbWriter hands each write (one slog record) to tb.Log until end.
type tbWriter struct {
	mu    sync.Mutex
	tb    testing.TB
	ended bool
}

func (w *tbWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.tb.Log(strings.TrimSuffix(string(b), "\n"))
	}
	return len(b), nil
}

func (w *tbWriter) end() {
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}
