// Package outage keeps a dependency outage from becoming a log storm.
package outage

import (
	"log/slog"
	"sync"
	"time"
)

// Log turns a stream of failures of one dependency into three kinds
// of log line: one warning when an outage starts, a reminder at most every
// Remind interval while it lasts, and one line when it ends. It keeps an
// outage from becoming a log storm. Safe for concurrent use.
type Log struct {
	logger *slog.Logger
	what   string
	Remind time.Duration

	mu       sync.Mutex
	since    time.Time
	lastLog  time.Time
	failures int
}

// New returns an Log for the dependency named what.
func New(logger *slog.Logger, what string) *Log {
	return &Log{logger: logger, what: what, Remind: 30 * time.Second}
}

// Fail records a failure.
func (o *Log) Fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.failures++
	switch {
	case o.since.IsZero():
		o.since, o.lastLog = now, now
		o.logger.Warn(o.what+" unavailable", "err", err)
	case now.Sub(o.lastLog) >= o.Remind:
		o.lastLog = now
		o.logger.Warn(o.what+" still unavailable", "for", now.Sub(o.since).Round(time.Second), "failures", o.failures, "err", err)
	}
}

// OK records a success, ending any outage.
func (o *Log) OK() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return
	}
	o.logger.Info(o.what+" available again", "after", time.Since(o.since).Round(time.Millisecond), "failures", o.failures)
	o.since, o.failures = time.Time{}, 0
}

// Down reports whether an outage is in progress.
func (o *Log) Down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}
