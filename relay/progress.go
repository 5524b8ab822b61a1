package relay

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/internal/outage"
)

// stallAfter is how long reads may fail, or return rows none of which can
// be published, before the relay calls itself stalled in its log. Shorter
// spells happen in every handoff.
const stallAfter = 2 * time.Second

// progress makes a relay that reads but does not publish loud instead of
// silent: it counts rows skipped because their lease went away; it logs a stall
// once, with reminders and a recovery line (internal/outage); and it
// measures how long the current stall has lasted. Safe for concurrent use.
type progress struct {
	logger *slog.Logger
	stall  *outage.Log

	mu           sync.Mutex
	stalledSince time.Time // zero while the relay makes progress or has nothing to do
	leaseLogged  time.Time // last warning about lease skips
	leaseSkips   int64     // lease skips not yet logged
	lastCheck    time.Time // when the relay last looked for a stall (checkDue) or published
}

func newProgress(logger *slog.Logger) *progress {
	return &progress{logger: logger, stall: outage.New(logger, "outbox publishing")}
}

// checkDue reports whether the relay may look for a stall at now (a look
// walks every key): at most every stallCheckEvery, and only once
// stallCheckEvery has passed without a publish.
func (p *progress) checkDue(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.lastCheck) < stallCheckEvery {
		return false
	}
	p.lastCheck = now
	return true
}

// read records one read and its error, if any.
func (p *progress) read(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.stalledLocked(time.Now(), err)
	}
}

// published records that the relay published something: any stall ends,
// and the next look for one is due stallCheckEvery from now. A look
// walks every key in memory; while the relay publishes, it could find a
// stall that the next round's publish would end, so a busy relay never
// walks (with many keys read ahead, the walk cost a capped node a tenth
// of its CPU).
func (p *progress) published() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalledSince = time.Time{}
	p.lastCheck = time.Now()
	p.stall.OK()
}

// idle records a round that published nothing while eligible rows (ready
// by the per-key rule, with room in the window) waited; none means the
// relay simply has nothing to do.
func (p *progress) idle(eligible int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if eligible == 0 {
		p.stalledSince = time.Time{}
		p.stall.OK()
		return
	}
	p.stalledLocked(time.Now(), fmt.Errorf("%d key(s) have a row ready to publish and none was published", eligible))
}

// stalledLocked starts or continues a stall, and logs it once it has
// lasted stallAfter.
func (p *progress) stalledLocked(now time.Time, why error) {
	if p.stalledSince.IsZero() {
		p.stalledSince = now
	}
	if now.Sub(p.stalledSince) >= stallAfter {
		p.stall.Fail(fmt.Errorf("%w; nothing published for %v", why, now.Sub(p.stalledSince).Round(time.Millisecond)))
	}
}

// leaseSkipped records n rows read but not published because their
// partition's lease lapsed or changed hands during the read, and warns at
// most once every 30 s.
func (p *progress) leaseSkipped(n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaseSkips += int64(n)
	if now := time.Now(); now.Sub(p.leaseLogged) >= 30*time.Second {
		p.logger.Warn("rows read were not published: their partition's lease lapsed or changed hands during the read; they stay pending",
			"rows", p.leaseSkips)
		p.leaseLogged, p.leaseSkips = now, 0
	}
}

// fill copies the counters into s.
func (p *progress) fill(s *Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalledSince.IsZero() {
		s.StalledSeconds = time.Since(p.stalledSince).Seconds()
	}
}
