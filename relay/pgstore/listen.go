package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/outbox"
)

// ErrNotListening is returned by Arm and Disarm while Listen is not
// connected (or not running): nothing is armed then.
var ErrNotListening = errors.New("outbox listener not connected")

// An arm is a session advisory lock (outbox.WakeLockClass, partition),
// exclusive, held by Listen's connection. The outbox trigger (outbox
// migration 10) tries the same lock shared, for each partition a
// statement wrote to: if the try fails (a relay armed it), it notifies;
// otherwise it holds the shared lock until its transaction ends. So
// pg_try_advisory_lock succeeds only once every producer that did not
// notify has committed or rolled back, and the locks go with the
// connection, as the LISTEN does.
const (
	sqlArm    = `SELECT p FROM unnest($1::int[]) AS p WHERE pg_try_advisory_lock($2::int, p)`
	sqlDisarm = `SELECT count(*) FROM unnest($1::int[]) AS p WHERE pg_advisory_unlock($2::int, p)`
)

// Without the producers' key_seq trigger (outbox.DropKeySeqTrigger) no
// producer notifies or takes a lock: Listen watches the outbox's identity
// sequence instead, one read of its page every watchTick while anything is
// armed and commits come (watch.tick: longer, up to watchIdleTick, the
// longer the sequence has been still), and wakes (and disarms) every
// armed partition when it moved. An
// arm then takes the sequence's value first and succeeds only if no other
// session holds a write lock on the outbox (pg_locks): a producer holds
// it from before it draws a seq until it ends, so every row whose seq was
// drawn by then has committed or rolled back, and any later draw moves the
// sequence. The identity must keep CACHE 1 (a cached draw does not move
// last_value).
//
// The trigger can go while Listen runs (outbox.DropKeySeqTrigger with the
// nodes up): from then on no producer notifies or takes an arm's lock, so
// a partition armed under the trigger would wait for the relay's poll
// (PollInterval, a second by default) for every commit. While it has
// partitions armed without the watch, Listen looks for the trigger every
// triggerCheck; once it is gone it disarms and wakes them all, as when the
// sequence moved, and the relay arms them again under the watch.
const (
	watchTick     = 2 * time.Millisecond
	watchIdleTick = 10 * time.Millisecond
	watchSlowing  = 25
	triggerCheck  = time.Second
	sqlTrigger    = `EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_assign_key_seq' AND tgrelid = 'outbox'::regclass)`
	sqlHasTrigger = `SELECT ` + sqlTrigger
	sqlArmState   = `
SELECT ` + sqlTrigger + `,
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_seq_seq),
       EXISTS (SELECT 1 FROM pg_locks
               WHERE locktype = 'relation' AND relation = 'outbox'::regclass AND mode = 'RowExclusiveLock'
                 AND pid <> pg_backend_pid())`
	sqlSeqValue = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_seq_seq`
)

// watch is Listen's view of the identity sequence, used while the
// key_seq trigger is gone.
type watch struct {
	on    bool      // no trigger: armed partitions are watched
	last  int64     // the sequence's value when last looked at
	moved time.Time // when it was last seen to move, or taken at an arm
}

// tick is how long Listen waits before it looks at the sequence again:
// fast (every base) while commits come, and slower the longer the
// sequence has been still, 1/watchSlowing of that time, up to
// watchIdleTick (or base, if longer). An idle node looks 100 times a
// second instead of 500: one look costs the node about 0.3 ms of CPU
// and its database session about 0.2 (docs/performance.md). Below 50 ms
// of stillness the looks stay every base, so at 200 commits a second
// nothing changes; at 10 a second a commit waits about 2 ms more on
// average, and one after a quiet spell up to watchIdleTick.
func (w *watch) tick(now time.Time, base time.Duration) time.Duration {
	return min(max(base, now.Sub(w.moved)/watchSlowing), max(base, watchIdleTick))
}

// armRequest asks Listen's connection to arm or disarm partitions.
type armRequest struct {
	arm   bool
	parts []int
	reply chan armReply
}

type armReply struct {
	armed []int
	err   error
}

// Arm implements relay.Notifications.
func (s *Store) Arm(ctx context.Context, partitions []int) ([]int, error) {
	return s.request(ctx, armRequest{arm: true, parts: partitions})
}

// Disarm implements relay.Notifications.
func (s *Store) Disarm(ctx context.Context, partitions []int) error {
	_, err := s.request(ctx, armRequest{parts: partitions})
	return err
}

func (s *Store) request(ctx context.Context, req armRequest) ([]int, error) {
	if !s.listening.Load() {
		return nil, ErrNotListening
	}
	req.reply = make(chan armReply, 1)
	// Listen takes a request between two notifications: at once, or
	// after its callback returns; a connection that hangs is bounded.
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case s.arms <- req:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, ErrNotListening
	}
	select {
	case rep := <-req.reply:
		return rep.armed, rep.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Listen implements relay.Notifications. It serves Arm and Disarm on its own
// connection while it waits.
func (s *Store) Listen(ctx context.Context, wake func(partition int)) error {
	down := outage.New(s.logger, "PostgreSQL listener")
	bo := backoff.New(100*time.Millisecond, 2*time.Second)
	slow := 0 // connects in a row that ran out of time
	for {
		listened, err := s.listenOnce(ctx, wake, down, &slow)
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			bo.Reset() // it worked: the next outage starts the backoff over
		}
		down.Fail(err)
		if !backoff.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
}

// listenConnectMin is the first bound of Listen's connect; it doubles
// after each connect in a row that ran out of time, up to 8 times as much
// (backoff.Doubled): a server slower to start a session than a fixed bound
// would never be reached.
const listenConnectMin = 10 * time.Second

func (s *Store) listenOnce(ctx context.Context, wake func(int), down *outage.Log, slow *int) (listened bool, err error) {
	cfg := s.pool.Config().ConnConfig.Copy()
	// An arm request interrupts the wait for notifications by a deadline
	// on the socket, now. (The pool's handler may send a cancel request
	// and let the read run on for seconds: nothing answers a cancel of an
	// idle session, and a late cancel could hit the arm's own statement.)
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	lo := cmp.Or(s.listenConnectMin, listenConnectMin)
	cctx, cancel := context.WithTimeout(ctx, backoff.Doubled(*slow, lo, 8*lo))
	conn, err := pgx.ConnectConfig(cctx, cfg)
	timedOut := cctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		if timedOut {
			*slow++
		}
		return false, fmt.Errorf("connect: %w", err)
	}
	*slow = 0
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel}.Sanitize()); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	down.OK()
	s.listening.Store(true)
	defer s.listening.Store(false)
	wake(-1) // read once: notifications sent while we were not listening are gone, and nothing is armed
	armed := map[int]bool{}
	var w watch
	for {
		tick := time.Duration(0)
		switch {
		case len(armed) == 0:
		case w.on:
			tick = w.tick(time.Now(), cmp.Or(s.watchTick, watchTick))
		default:
			tick = triggerCheck
		}
		n, req, err := s.next(ctx, conn, tick)
		if req != nil {
			if rerr := serveArm(ctx, conn, armed, &w, *req); rerr != nil {
				return true, rerr
			}
		}
		if errors.Is(err, errTick) {
			if w.on {
				err = s.watchSeq(ctx, conn, armed, &w, wake)
			} else {
				err = checkTrigger(ctx, conn, armed, wake)
			}
			if err != nil {
				return true, err
			}
			continue
		}
		if err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		if n != nil {
			// A payload that is not a partition is not ours: ignored.
			if p, err := strconv.Atoi(n.Payload); err == nil && p >= 0 {
				// A notification disarms its partition, before the
				// relay wakes: the commits after it do not notify (nor
				// take NOTIFY's lock) until the relay has read it and
				// armed it again.
				if armed[p] {
					if err := applyArm(ctx, conn, armed, false, []int32{int32(p)}); err != nil {
						wake(p)
						return true, err
					}
				}
				wake(p)
			}
		}
	}
}

// errTick is next's error when its tick passed with nothing to report.
var errTick = errors.New("tick")

// watchSeq looks at the identity sequence and, if it moved, disarms and
// wakes every armed partition.
func (s *Store) watchSeq(ctx context.Context, conn *pgx.Conn, armed map[int]bool, w *watch, wake func(int)) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var v int64
	if err := conn.QueryRow(qctx, sqlSeqValue).Scan(&v); err != nil {
		return fmt.Errorf("watch the outbox's sequence: %w", err)
	}
	if v == w.last {
		return nil
	}
	w.last, w.moved = v, time.Now()
	return wakeArmed(ctx, conn, armed, wake)
}

// checkTrigger looks whether the key_seq trigger is still there and, if it
// is gone, disarms and wakes every armed partition (see triggerCheck).
func checkTrigger(ctx context.Context, conn *pgx.Conn, armed map[int]bool, wake func(int)) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var trigger bool
	if err := conn.QueryRow(qctx, sqlHasTrigger).Scan(&trigger); err != nil {
		return fmt.Errorf("look for the key_seq trigger: %w", err)
	}
	if trigger {
		return nil
	}
	return wakeArmed(ctx, conn, armed, wake)
}

// wakeArmed disarms and wakes every armed partition.
func wakeArmed(ctx context.Context, conn *pgx.Conn, armed map[int]bool, wake func(int)) error {
	parts := make([]int32, 0, len(armed))
	for p := range armed {
		parts = append(parts, int32(p))
	}
	err := applyArm(ctx, conn, armed, false, parts)
	for _, p := range parts {
		wake(int(p))
	}
	return err
}

// next waits for a notification or an arm request, whichever comes first
// (both, at times), or, if tick > 0, for tick at most (errTick). A request
// interrupts the wait: pgx sets a deadline on the socket, and a timed-out
// read leaves the connection usable.
func (s *Store) next(ctx context.Context, conn *pgx.Conn, tick time.Duration) (*pgconn.Notification, *armRequest, error) {
	select {
	case req := <-s.arms:
		return nil, &req, nil
	default:
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if tick > 0 {
		var tcancel context.CancelFunc
		wctx, tcancel = context.WithTimeout(wctx, tick)
		defer tcancel()
	}
	got := make(chan *armRequest, 1)
	stop := make(chan struct{})
	go func() {
		select {
		case req := <-s.arms:
			got <- &req
			cancel()
		case <-stop:
			got <- nil
		}
	}()
	n, err := conn.WaitForNotification(wctx)
	close(stop)
	req := <-got
	if req != nil && ctx.Err() == nil && err != nil && wctx.Err() != nil {
		err = nil // interrupted for the request
	}
	if req == nil && n == nil && ctx.Err() == nil && err != nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
		err = errTick
	}
	return n, req, err
}

// serveArm arms or disarms on conn and replies. It returns an error only
// when the connection failed (the reply carries it too).
func serveArm(ctx context.Context, conn *pgx.Conn, armed map[int]bool, w *watch, req armRequest) error {
	var todo []int32
	for _, p := range req.parts {
		if armed[p] != req.arm {
			todo = append(todo, int32(p))
		}
	}
	var rep armReply
	if len(todo) > 0 && req.arm {
		// The sequence before the writers: see watch.
		var trigger, writers bool
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rep.err = conn.QueryRow(qctx, sqlArmState).Scan(&trigger, &w.last, &writers)
		cancel()
		w.moved = time.Now() // the relay read before it armed: commits may be coming
		if rep.err != nil {
			rep.err = fmt.Errorf("arm: %w", rep.err)
		}
		w.on = !trigger
		if rep.err == nil && w.on && writers {
			todo = nil // a producer's transaction is open: poll meanwhile
		}
	}
	if len(todo) > 0 && rep.err == nil {
		rep.err = applyArm(ctx, conn, armed, req.arm, todo)
	}
	if req.arm && rep.err == nil {
		for _, p := range req.parts {
			if armed[p] {
				rep.armed = append(rep.armed, p)
			}
		}
	}
	req.reply <- rep
	return rep.err
}

func applyArm(ctx context.Context, conn *pgx.Conn, armed map[int]bool, arm bool, parts []int32) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !arm {
		if _, err := conn.Exec(qctx, sqlDisarm, parts, outbox.WakeLockClass); err != nil {
			return fmt.Errorf("disarm: %w", err)
		}
		for _, p := range parts {
			delete(armed, int(p))
		}
		return nil
	}
	rows, err := conn.Query(qctx, sqlArm, parts, outbox.WakeLockClass)
	if err != nil {
		return fmt.Errorf("arm: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("arm: %w", err)
	}
	for _, p := range got {
		armed[int(p)] = true
	}
	return nil
}
