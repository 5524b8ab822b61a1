package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/wire"
)

// session is one confirm-mode channel and what is unconfirmed on it.
type session struct {
	conn     *amqp.Connection
	raw      *corkConn // conn's TCP connection; nil if not known
	ch       *amqp.Channel
	frameMax int                   // negotiated frame_max; 0: no limit
	pending  map[uint64]pendingPub // by delivery tag; guarded by Publisher.mu
	// expired maps the delivery tag of a publish settled Failed by the
	// confirm timeout to its attempt, so that its late return and ack are
	// recognised and dropped; guarded by Publisher.mu.
	expired map[uint64]int64
	// progress is the last time a confirm came, or a block ended;
	// guarded by Publisher.mu.
	progress time.Time
	closed   bool          // guarded by Publisher.mu
	side     *amqp.Channel // for passive declares; guarded by pubMu
	dog      *watchdog     // guards each write's lease deadline
	// corked: raw holds the publishes written since it was corked
	// (corkFor), corkedBy the one of them with the earliest deadline (nil
	// if none has one); guarded by pubMu. hold sends what is held
	// corkHold after the cork, if nothing else did.
	corked   bool
	corkedBy *relay.Message
	hold     *time.Timer
}

type pendingPub struct {
	attempt int64 // the wire.HeaderAttempt value it was sent with
	sent    time.Time
	settle  func(relay.Result)
}

// resume gives the publishes of s back the time d they waited while the
// broker blocked the connection. Called with Publisher.mu held.
func (s *session) resume(d time.Duration) {
	for tag, pp := range s.pending {
		pp.sent = pp.sent.Add(d)
		s.pending[tag] = pp
	}
	s.progress = time.Now()
}

// returns holds the basic.returns read but not yet matched to an ack, by
// the attempt they echo.
type returns map[int64]error

// add records r under the attempt in its headers; a return without one
// (not sent by this publisher) is dropped.
func (rs returns) add(r amqp.Return) {
	a, err := wire.Int(r.Headers, wire.HeaderAttempt)
	if err != nil {
		return
	}
	rs[a] = fmt.Errorf("returned by broker: %d %s (exchange %q, routing key %q)",
		r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
}

// channelEvents are the notifications of one channel, sized so the
// library never has to drop one.
type channelEvents struct {
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error
}

// openSession opens a confirm-mode channel on conn, registers its
// notifications and makes it the current session.
func (p *Publisher) openSession(conn *amqp.Connection, raw *corkConn, frameMax int) (*session, channelEvents, error) {
	var ch *amqp.Channel
	if err := p.bounded(conn, "open channel", func() (err error) { ch, err = conn.Channel(); return err }); err != nil {
		return nil, channelEvents{}, fmt.Errorf("open channel: %w", err)
	}
	if err := p.bounded(conn, "confirm mode", func() error { return ch.Confirm(false) }); err != nil {
		p.closeChannel(conn, ch)
		return nil, channelEvents{}, fmt.Errorf("confirm mode: %w", err)
	}
	buf := 2*p.cfg.Window + 16
	ev := channelEvents{
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, buf)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, buf)),
		closed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
	s := &session{conn: conn, raw: raw, ch: ch, frameMax: frameMax, pending: map[uint64]pendingPub{},
		expired: map[uint64]int64{}, progress: time.Now()}
	s.dog = p.newWatchdog(s)
	s.hold = p.newHoldTimer(s)
	p.mu.Lock()
	p.cur = s
	p.opened++
	p.mu.Unlock()
	p.down.OK()
	p.cfg.Logger.Info("RabbitMQ channel open")
	return s, ev, nil
}

// serveChannel opens a confirm-mode channel on conn and settles its
// publishes until it or the connection closes, or ctx ends. confirmed
// reports whether a publish was acked on it.
func (p *Publisher) serveChannel(ctx context.Context, conn *amqp.Connection, raw *corkConn, connClosed <-chan *amqp.Error, frameMax int) (confirmed bool, err error) {
	s, ev, err := p.openSession(conn, raw, frameMax)
	if err != nil {
		return false, err
	}
	rets, confirms, chClosed := ev.returns, ev.confirms, ev.closed
	returned := returns{}
	drainReturns := func() {
		for {
			select {
			case r, ok := <-rets:
				if !ok {
					return
				}
				returned.add(r)
			default:
				return
			}
		}
	}
	settle := func(c amqp.Confirmation) {
		if p.settleOne(s, c, returned, drainReturns) {
			confirmed = true
		}
	}

	tick := time.NewTicker(max(min(p.cfg.ConfirmTimeout, p.stallTimeout())/4, 10*time.Millisecond))
	defer tick.Stop()
	var cause error
loop:
	for {
		select {
		case <-ctx.Done():
			cause = ctx.Err()
			break loop
		case now := <-tick.C:
			p.expire(s, now)
			if err := p.stalled(s, now); err != nil {
				cause = err
				break loop
			}
		case r, ok := <-rets:
			if ok {
				returned.add(r)
			}
		case c, ok := <-confirms:
			if !ok {
				cause = errors.New("channel closed")
				break loop
			}
			settle(c)
		case e := <-chClosed:
			cause = errors.New("channel closed")
			if e != nil {
				cause = e
			}
			break loop
		case e := <-connClosed:
			cause = errors.New("connection closed")
			if e != nil {
				cause = fmt.Errorf("connection closed: %w", e)
			}
			break loop
		}
	}
	if errors.Is(cause, errStalled) || p.Status().Blocked != "" {
		// Nothing would answer a polite close: drop the connection.
		p.closeConn(conn, 0)
	}
	p.closeSession(s, cause, confirms, settle)
	return confirmed, cause
}

// stallTimeout is StallTimeout, or the confirm timeout when it is off (for
// the ticker only).
func (p *Publisher) stallTimeout() time.Duration {
	if p.cfg.StallTimeout > 0 {
		return p.cfg.StallTimeout
	}
	return p.cfg.ConfirmTimeout
}

// settleOne settles the publish c confirms, after reading every return
// already delivered: the broker sends basic.return before the ack, and the
// library hands both over from one goroutine in that order. A return is
// matched to its publish by the attempt it echoes, so a return left by an
// expired publish of the same message is never charged to a later one.
// It reports whether c acked a publish still waiting.
func (p *Publisher) settleOne(s *session, c amqp.Confirmation, returned returns, drainReturns func()) bool {
	p.mu.Lock()
	pp, ok := s.pending[c.DeliveryTag]
	delete(s.pending, c.DeliveryTag)
	stale, wasExpired := s.expired[c.DeliveryTag]
	delete(s.expired, c.DeliveryTag)
	s.progress = time.Now()
	p.mu.Unlock()
	drainReturns()
	if wasExpired {
		delete(returned, stale) // its outcome was settled long ago
	}
	if !ok {
		return false
	}
	switch rerr, wasReturned := returned[pp.attempt]; {
	case wasReturned:
		delete(returned, pp.attempt)
		pp.settle(relay.Result{Outcome: relay.Returned, Err: rerr})
	case !c.Ack:
		pp.settle(relay.Result{Outcome: relay.Nacked, Err: errors.New("nacked by broker")})
	default:
		pp.settle(relay.Result{Outcome: relay.Confirmed})
		return true
	}
	return false
}

// closeSession stops new publishes on s, settles what the library still
// delivers, then everything else: Unsent, or Failed for the culprit of a
// broker error found while isolating.
func (p *Publisher) closeSession(s *session, cause error, confirms <-chan amqp.Confirmation, settle func(amqp.Confirmation)) {
	p.pubMu.Lock()
	p.uncork(s) // what is held goes before the closes below, which wait for answers
	p.mu.Lock()
	s.closed = true
	p.cur = nil
	p.mu.Unlock()
	side := s.side
	p.pubMu.Unlock()
	if side != nil {
		p.closeChannel(s.conn, side)
	}
	p.closeChannel(s.conn, s.ch)
	for c := range confirms { // closed by the library when the channel closes
		settle(c)
	}
	culprits := attributable(cause)
	p.mu.Lock()
	rest := s.pending
	s.pending = nil
	isolating := p.isolate > 0
	if culprits {
		// Send the next publishes one at a time, enough of them to get past
		// everything that was in flight.
		p.isolate = 2*len(rest) + 16
	}
	p.mu.Unlock()
	for _, pp := range rest {
		if culprits && isolating && len(rest) == 1 {
			// Alone in flight when the broker closed the channel or the
			// connection: it is the cause. A failure, so it backs off and
			// is parked.
			pp.settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("the broker closed the channel over this message: %w", cause)})
			continue
		}
		pp.settle(relay.Result{Outcome: relay.Unsent, Err: fmt.Errorf("unconfirmed when the channel closed: %w", cause)})
	}
	if len(rest) > 0 {
		p.cfg.Logger.Info("unconfirmed messages will be republished", "count", len(rest))
	}
}

// attributable reports whether the broker closed the channel or the
// connection over something one message may have done: a channel error
// other than a missing exchange (404 closes the channel too, but the
// exchange checks handle it), or a server-initiated connection error of
// the 5xx class (e.g. 501 FRAME_ERROR for a frame over frame_max). A
// network drop, a broker shutdown (320) or a stall is not.
func attributable(cause error) bool {
	var aerr *amqp.Error
	if !errors.As(cause, &aerr) || !aerr.Server {
		return false
	}
	if aerr.Recover {
		return aerr.Code != amqp.NotFound
	}
	return aerr.Code >= 500 && aerr.Code < 600
}

// closeChannel closes ch, bounded: a blocked broker would not answer.
func (p *Publisher) closeChannel(conn *amqp.Connection, ch *amqp.Channel) {
	if ch.IsClosed() {
		return
	}
	_ = p.bounded(conn, "close channel", ch.Close)
}

// waitIsolated, while isolating, waits until nothing is unconfirmed on s,
// or until the lease deadline until (zero: none). Called with pubMu held;
// the serve loop settles confirms without it.
func (p *Publisher) waitIsolated(ctx context.Context, s *session, until time.Time) error {
	for {
		p.mu.Lock()
		isolating, busy, closed := p.isolate > 0, len(s.pending) > 0, s.closed
		p.mu.Unlock()
		switch {
		case closed || s.ch.IsClosed():
			// The serve loop needs pubMu to finish closing: give it back.
			return relay.ErrNotConnected
		case !isolating || !busy:
			return nil
		case !until.IsZero() && !time.Now().Before(until):
			return leaseExpired("waiting for earlier confirms (isolation)")
		}
		p.uncork(s) // the confirms waited for may be of publishes it holds
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// expire fails the publishes of s waiting longer than ConfirmTimeout,
// unless the broker blocks the connection (then nobody's clock runs).
func (p *Publisher) expire(s *session, now time.Time) {
	var late []pendingPub
	p.mu.Lock()
	if p.blocked != "" {
		p.mu.Unlock()
		return
	}
	for tag, pp := range s.pending {
		if now.Sub(pp.sent) >= p.cfg.ConfirmTimeout {
			late = append(late, pp)
			delete(s.pending, tag)
			s.expired[tag] = pp.attempt
		}
	}
	p.mu.Unlock()
	for _, pp := range late {
		pp.settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("%w (%v)", ErrConfirmTimeout, p.cfg.ConfirmTimeout)})
	}
	if len(late) > 0 {
		p.cfg.Logger.Warn("publishes unconfirmed past the confirm timeout; counted as failed attempts",
			"count", len(late), "timeout", p.cfg.ConfirmTimeout)
	}
}

// errStalled is the cause of a session closed because its link stopped
// confirming.
var errStalled = errors.New("no publisher confirm within the stall timeout: the link is taken for dead")

// stalled reports errStalled when a publish has waited StallTimeout on s
// and no confirm came meanwhile, the broker not blocking the connection.
func (p *Publisher) stalled(s *session, now time.Time) error {
	if p.cfg.StallTimeout <= 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked != "" || now.Sub(s.progress) < p.cfg.StallTimeout {
		return nil
	}
	for _, pp := range s.pending {
		if now.Sub(pp.sent) >= p.cfg.StallTimeout {
			p.stalls++
			return fmt.Errorf("%w (%v, %d unconfirmed)", errStalled, p.cfg.StallTimeout, len(s.pending))
		}
	}
	return nil
}
