package testkit

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWaitFor(t *testing.T) {
	calls := 0
	took := WaitFor(t, 10*time.Second, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 || took <= 0 || took > 5*time.Second {
		t.Fatalf("WaitFor returned after %d calls and %v; want 3 calls, soon", calls, took)
	}

	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(f, 30*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if f.msg != "never: not within 30ms" {
		t.Fatalf("failure message = %q", f.msg)
	}
}

// logTB records Log calls and Cleanup functions instead of passing them on.
type logTB struct {
	testing.TB
	mu       sync.Mutex
	lines    []string
	cleanups []func()
}

func (l *logTB) Log(args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range args {
		l.lines = append(l.lines, a.(string))
	}
}

func (l *logTB) Cleanup(f func()) { l.cleanups = append(l.cleanups, f) }

func TestLogger(t *testing.T) {
	t.Setenv("ORDO_TEST_DEBUG", "")
	tb := &logTB{TB: t}
	log := Logger(tb, slog.LevelWarn)
	log.Info("below the level")
	log.Warn("kept", "k", 1)
	for _, f := range tb.cleanups {
		f()
	}
	log.Error("after the test ended") // must neither panic nor reach tb
	if len(tb.lines) != 1 || !strings.Contains(tb.lines[0], "msg=kept k=1") || strings.HasSuffix(tb.lines[0], "\n") {
		t.Fatalf("logged %q; want the one warning, without its newline", tb.lines)
	}

	t.Setenv("ORDO_TEST_DEBUG", "1")
	tb = &logTB{TB: t}
	Logger(tb, slog.LevelWarn).Debug("debug")
	if len(tb.lines) != 1 {
		t.Fatalf("with ORDO_TEST_DEBUG logged %q; want the debug record", tb.lines)
	}
}
