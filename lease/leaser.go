package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/relay"
)

// Leaser claims, renews and releases partition leases in the ordo_leases
// table on one dedicated connection, and tells its relay about them: it
// implements relay.Ownership. Create it with New and run it with Run.
type Leaser struct {
	cfg    Config
	events *mailbox
	acked  chan struct{} // coalesced: a relay acknowledged a revoke

	lastRenew time.Time // owned by Run
	lastWant  []int     // owned by Run: the wanted set of the previous tick

	mu       sync.Mutex
	leases   map[int]relay.Lease
	revoking map[int]*revocation // held, no longer wanted, not yet released
	stats    Stats
}

// Stats are a Leaser's running totals since it started.
type Stats struct {
	// Claims counts leases claimed (each partition once per claim).
	Claims int64
	// RenewalFailures counts renewal rounds that failed (the database did
	// not answer); Losses counts leases a renewal found held by another
	// node or epoch.
	RenewalFailures, Losses int64
	// Handoffs counts leases released because they were no longer wanted;
	// HandoffTimeouts those released before the relay acknowledged.
	Handoffs, HandoffTimeouts int64
	// Rebalances counts changes of the wanted set (the assignment).
	Rebalances int64
}

var _ relay.Ownership = (*Leaser)(nil)

// New returns a Leaser for cfg (its zero fields filled, see Config), or
// cfg's problems; call Run to start it.
func New(cfg Config) (*Leaser, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Leaser{cfg: cfg, events: newMailbox(), acked: make(chan struct{}, 1),
		leases: map[int]relay.Lease{}, revoking: map[int]*revocation{}}, nil
}

// Stats returns the running totals. Safe for concurrent use.
func (l *Leaser) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// Leases returns the leases held now, leaving out those being handed off.
// Safe for concurrent use.
func (l *Leaser) Leases() map[int]relay.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]relay.Lease, len(l.leases))
	for p, x := range l.leases {
		if l.revoking[p] == nil {
			m[p] = x
		}
	}
	return m
}

// Lease implements relay.Ownership.
func (l *Leaser) Lease(p int) (relay.Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.revoking[p] != nil {
		return relay.Lease{}, false
	}
	x, ok := l.leases[p]
	return x, ok
}

// Events implements relay.Ownership. Events are delivered while Run runs.
func (l *Leaser) Events() <-chan relay.Event { return l.events.out }

// held returns every lease held, handoffs included.
func (l *Leaser) held() map[int]relay.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]relay.Lease, len(l.leases))
	for p, x := range l.leases {
		m[p] = x
	}
	return m
}

// Run claims the wanted partitions, renews them every RenewEvery and hands
// off those no longer wanted, until ctx ends; then it releases every lease
// it holds (with a short bound of its own) and returns nil. Stop the relay
// first, so nothing is published under a released lease. Database errors
// are outages: logged (rate limited) and retried; they do not end Run.
func (l *Leaser) Run(ctx context.Context) error {
	deliver, stopDelivery := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.events.run(deliver)
	}()
	defer wg.Wait()
	defer stopDelivery()
	var conn *pgx.Conn
	defer func() { l.releaseAll(conn) }()
	down := outage.New(l.cfg.Logger, "lease database")
	// Failed connects are tried again after a backoff with jitter, from
	// about RenewEvery: every node's leasers lose their connections at the
	// same moment when the database restarts, and a slow server is not
	// helped by all of them coming back in step.
	redial := backoff.New(l.cfg.RenewEvery, 3*l.cfg.RenewEvery)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-l.cfg.Wake:
		case <-l.acked:
		}
		if conn == nil || conn.IsClosed() {
			c, err := l.cfg.Connect(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				down.Fail(err)
				t.Reset(redial.Next())
				continue
			}
			conn = c
			redial.Reset()
		}
		next, err := l.tick(ctx, conn)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			down.Fail(err)
			conn.Close(context.Background())
			conn = nil
			// Try again when the renewal is due (at once if it is).
			next = l.lastRenew.Add(l.cfg.RenewEvery)
		} else {
			down.OK()
		}
		t.Reset(max(time.Until(next), 10*time.Millisecond))
	}
}

// tick renews what is held (once per RenewEvery), hands off what is no
// longer wanted, and claims what is wanted and free. It returns when it
// wants to run next: the next renewal, the next handoff timeout, or soon
// when a wanted partition is still held elsewhere. It never waits on the
// relay.
func (l *Leaser) tick(ctx context.Context, conn *pgx.Conn) (next time.Time, err error) {
	// A renewal may wait behind relay writes holding the lease rows FOR
	// SHARE; give it until half the TTL before calling the database down.
	qctx, cancel := context.WithTimeout(ctx, max(l.cfg.RenewEvery, l.cfg.TTL/2))
	defer cancel()
	want := l.want()
	if time.Since(l.lastRenew) >= l.cfg.RenewEvery {
		if err := l.renew(qctx, conn); err != nil {
			return time.Time{}, err
		}
	}
	next = l.lastRenew.Add(l.cfg.RenewEvery)
	over, timeout := l.handoff(want, time.Now())
	if !timeout.IsZero() && timeout.Before(next) {
		next = timeout
	}
	if len(over) > 0 {
		leases := make([]relay.Lease, len(over))
		for i, r := range over {
			leases[i] = r.lease
		}
		if err := l.releaseLeases(qctx, conn, leases); err != nil {
			return time.Time{}, err
		}
		l.handedOff(over, time.Now())
	}
	held := l.held()
	var claim []int32
	for p := range want {
		if _, ok := held[p]; !ok {
			claim = append(claim, int32(p))
		}
	}
	if len(claim) == 0 {
		return next, nil
	}
	slices.Sort(claim)
	got, err := l.claim(qctx, conn, claim)
	if err != nil {
		return time.Time{}, err
	}
	if got < len(claim) {
		// Held elsewhere (its owner is handing it off, or will let it
		// expire): look again soon.
		if soon := time.Now().Add(l.cfg.TTL / 20); soon.Before(next) {
			next = soon
		}
	}
	return next, nil
}

// want asks Want for the wanted set and counts its changes.
func (l *Leaser) want() map[int]bool {
	want := l.cfg.Want()
	if !slices.Equal(want, l.lastWant) {
		if l.lastWant != nil {
			l.mu.Lock()
			l.stats.Rebalances++
			l.mu.Unlock()
		}
		l.lastWant = slices.Clone(want)
		if l.lastWant == nil {
			l.lastWant = []int{}
		}
	}
	set := make(map[int]bool, len(want))
	for _, p := range want {
		set[p] = true
	}
	return set
}

// renew extends every held lease and drops the ones found lost.
func (l *Leaser) renew(ctx context.Context, conn *pgx.Conn) error {
	held := l.held()
	sent := time.Now()
	if len(held) == 0 {
		l.lastRenew = sent
		return nil
	}
	parts := make([]int32, 0, len(held))
	epochs := make([]int64, 0, len(held))
	for p, x := range held {
		parts = append(parts, int32(p))
		epochs = append(epochs, x.Epoch)
	}
	rows, err := conn.Query(ctx, sqlRenew, l.cfg.Node, l.cfg.TTL.Seconds(), parts, epochs)
	if err != nil {
		l.renewalFailed()
		return fmt.Errorf("renew leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		l.renewalFailed()
		return fmt.Errorf("renew leases: %w", err)
	}
	l.lastRenew = sent
	ok := make(map[int]bool, len(renewed))
	for _, p := range renewed {
		ok[int(p)] = true
	}
	lostParts, lostEpochs := l.renewed(held, ok, sent)
	if len(lostParts) == 0 {
		return nil
	}
	l.cfg.Logger.Warn("leases lost: another node holds them now", "partitions", lostParts, "epochs", lostEpochs)
	return nil
}

// renewed moves the deadline of the leases renewed at sent, and drops the
// others (lost: the relay is told, and nothing waits for it), returning
// them sorted.
func (l *Leaser) renewed(held map[int]relay.Lease, ok map[int]bool, sent time.Time) (parts []int32, epochs []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, x := range held {
		if ok[p] {
			x.Deadline = sent.Add(l.cfg.TTL - l.cfg.Margin)
			l.leases[p] = x
			continue
		}
		delete(l.leases, p)
		delete(l.revoking, p)
		parts = append(parts, int32(p))
		l.events.push(relay.Revoked{Partition: p, Epoch: x.Epoch})
	}
	slices.Sort(parts)
	for _, p := range parts {
		epochs = append(epochs, held[int(p)].Epoch)
	}
	l.stats.Losses += int64(len(parts))
	return parts, epochs
}

func (l *Leaser) renewalFailed() {
	l.mu.Lock()
	l.stats.RenewalFailures++
	l.mu.Unlock()
}

// claim takes what it can of parts, tells the relay, and returns how many
// it got.
func (l *Leaser) claim(ctx context.Context, conn *pgx.Conn, parts []int32) (int, error) {
	sent := time.Now()
	rows, err := conn.Query(ctx, sqlClaim, l.cfg.Node, l.cfg.TTL.Seconds(), parts)
	if err != nil {
		return 0, fmt.Errorf("claim leases: %w", err)
	}
	type claimed struct {
		Partition int32
		Epoch     int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimed])
	if err != nil {
		return 0, fmt.Errorf("claim leases: %w", err)
	}
	if len(got) == 0 {
		return 0, nil
	}
	slices.SortFunc(got, func(a, b claimed) int { return int(a.Partition - b.Partition) })
	ps := make([]int, 0, len(got))
	l.mu.Lock()
	l.stats.Claims += int64(len(got))
	for _, c := range got {
		x := relay.Lease{Partition: int(c.Partition), Epoch: c.Epoch, Deadline: sent.Add(l.cfg.TTL - l.cfg.Margin)}
		l.leases[x.Partition] = x
		l.events.push(relay.Assigned{Lease: x})
		ps = append(ps, x.Partition)
	}
	l.mu.Unlock()
	l.cfg.Logger.Info("leases claimed", "count", len(ps), "partitions", ps)
	return len(got), nil
}

func (l *Leaser) releaseLeases(ctx context.Context, conn *pgx.Conn, leases []relay.Lease) error {
	parts := make([]int32, len(leases))
	epochs := make([]int64, len(leases))
	for i, x := range leases {
		parts[i], epochs[i] = int32(x.Partition), x.Epoch
	}
	if _, err := conn.Exec(ctx, sqlRelease, l.cfg.Node, parts, epochs); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// releaseAll gives back every held lease when Run ends, so another node
// can claim it at once, on conn or, when ctx's end closed it, a fresh
// connection; then it closes the connection.
func (l *Leaser) releaseAll(conn *pgx.Conn) {
	held := l.held()
	l.mu.Lock()
	clear(l.leases)
	clear(l.revoking)
	l.mu.Unlock()
	if len(held) == 0 {
		if conn != nil {
			conn.Close(context.Background())
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if conn == nil || conn.IsClosed() {
		c, err := l.cfg.Connect(ctx)
		if err != nil {
			l.cfg.Logger.Warn("release leases: they will expire instead", "err", err)
			return
		}
		conn = c
	}
	defer conn.Close(context.Background())
	all := make([]relay.Lease, 0, len(held))
	for _, x := range held {
		all = append(all, x)
	}
	if err := l.releaseLeases(ctx, conn, all); err != nil {
		l.cfg.Logger.Warn("release leases: they will expire instead", "err", err)
		return
	}
	l.cfg.Logger.Info("leases released", "count", len(all))
}
