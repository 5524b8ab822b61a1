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

// Publish implements relay.Publisher. It keeps to m.Deadline as
// watchdog.go describes: checked after the publish lock, the exchange
// check and the isolation wait, and last right before the write, which
// runs under a watchdog.
func (p *Publisher) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	if err := checkSendable(m); err != nil {
		// The client or the broker would reject it by closing the channel
		// or the connection: the message would be retried as Unsent
		// forever, without ever counting an attempt.
		settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("%w: %w", ErrUnsendable, err)})
		return nil
	}
	if p.cfg.CloudEvents && m.Type == "" {
		settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("%w: %w", ErrUnsendable, errCloudEventType)})
		return nil
	}
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	if m.Expired(time.Now()) {
		return leaseExpired("waiting for the publish lock")
	}
	s, err := p.session()
	if err != nil {
		return err
	}
	attempt := p.attempt.Add(1)
	annotateAttempt(ctx, attempt)
	pub := p.publishing(m, attempt)
	if p.cfg.CloudEvents {
		addCloudEvents(pub.Headers, m, p.cfg.CloudEventsSource)
	}
	if err := checkFrame(&pub, s.frameMax); err != nil && !p.noFrameCheck {
		settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("%w: %w", ErrUnsendable, err)})
		return nil
	}
	if m.Exchange != "" {
		if err := p.checkExchange(s, m.Exchange, m.Deadline); err != nil {
			if errors.Is(err, relay.ErrExchangeNotFound) {
				settle(relay.Result{Outcome: relay.Failed, Err: err})
				return nil
			}
			return err
		}
	}
	if err := p.waitIsolated(ctx, s, m.Deadline); err != nil {
		return err
	}
	tag := s.ch.GetNextPublishSeqNo()
	if p.beforeWrite != nil {
		p.beforeWrite()
	}
	p.mu.Lock()
	switch {
	case s.closed:
		p.mu.Unlock()
		return relay.ErrNotConnected
	case m.Expired(time.Now()):
		// The last check: nothing waits between it and the write.
		p.mu.Unlock()
		return leaseExpired("before the write")
	}
	if p.isolate > 0 {
		p.isolate--
	}
	s.pending[tag] = pendingPub{attempt: attempt, sent: time.Now(), settle: settle}
	p.mu.Unlock()

	p.corkFor(s, m)
	guard := m // the write may send what is held: it keeps the earliest deadline
	if s.corkedBy != nil {
		guard = s.corkedBy
	}
	cut, err := p.watched(s, guard, func() error {
		return s.ch.PublishWithContext(ctx, m.Exchange, m.RoutingKey, true, false, pub)
	})
	if err != nil {
		return p.writeFailed(s, tag, cut, err)
	}
	return nil
}

// corkLead is how far a message's deadline must lie for its write to be
// held corked: a corked connection sends what it holds within corkHold
// even if nobody uncorks, so a message held no nearer than this to its
// deadline reaches the broker before it.
const corkLead = time.Second

// corkHold is the longest a corked connection holds a write: the hold
// timer uncorks it then, for a caller that publishes and never flushes.
const corkHold = 200 * time.Millisecond

// corkFor corks s's connection before the write of m, so that the
// publishes of one round of the relay leave in one write (the client
// library writes each on its own: one write system call, one TCP segment
// and one wake-up of the broker each, uncorked); Flush uncorks. A
// message whose deadline is near is sent at once, and with it what was
// held. Called with pubMu held.
func (p *Publisher) corkFor(s *session, m *relay.Message) {
	if s.raw == nil {
		return
	}
	if !m.Deadline.IsZero() && time.Until(m.Deadline) < corkLead {
		p.uncork(s)
		return
	}
	if !s.corked {
		s.raw.cork()
		s.corked = true
		p.calls.Add(1) // done by the timer's function, or by uncork if it never runs
		s.hold.Reset(corkHold)
	}
	if !m.Deadline.IsZero() && (s.corkedBy == nil || m.Deadline.Before(s.corkedBy.Deadline)) {
		s.corkedBy = m
	}
}

// uncork sends what s's corked connection holds, in one write under the
// watchdog armed for the earliest deadline held, unless that deadline
// passed meanwhile: then it resets the connection rather than let the
// message arrive late (the publishes it held settle Unsent with the
// session). Called with pubMu held.
func (p *Publisher) uncork(s *session) {
	if !s.corked {
		return
	}
	m := s.corkedBy
	s.corked, s.corkedBy = false, nil
	if s.hold.Stop() {
		p.calls.Done()
	}
	if m != nil && m.Expired(time.Now()) {
		p.cutOff(s, m)
		return
	}
	if m == nil {
		_ = s.raw.uncork() // a failure closes the connection: the session ends
		return
	}
	_, _ = p.watched(s, m, s.raw.uncork)
}

// newHoldTimer returns s's hold timer, stopped: armed by corkFor, it
// uncorks s corkHold after the cork.
func (p *Publisher) newHoldTimer(s *session) *time.Timer {
	t := time.AfterFunc(time.Hour, func() {
		defer p.calls.Done()
		p.pubMu.Lock()
		defer p.pubMu.Unlock()
		p.uncork(s)
	})
	t.Stop()
	return t
}

// Flush implements relay.Flusher: it sends what the current session's
// connection holds corked.
func (p *Publisher) Flush() {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	p.mu.Lock()
	s := p.cur
	p.mu.Unlock()
	if s != nil {
		p.uncork(s)
	}
}

// writeFailed takes back the pending publish tag whose write failed with
// err (cut: the watchdog reset the connection at the lease deadline), and
// returns what Publish returns for it.
func (p *Publisher) writeFailed(s *session, tag uint64, cut bool, err error) error {
	p.mu.Lock()
	_, mine := s.pending[tag]
	delete(s.pending, tag)
	p.mu.Unlock()
	switch {
	case !mine:
		return nil // the closing session settled it already
	case cut:
		return fmt.Errorf("%w (the write was cut off: connection reset): %w", relay.ErrLeaseExpired, err)
	}
	return fmt.Errorf("publish: %w", err)
}

// session returns the open session, or why there is none to publish on.
func (p *Publisher) session() (*session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.cur == nil:
		return nil, relay.ErrNotConnected
	case p.blocked != "":
		return nil, fmt.Errorf("%w (%s)", ErrBlocked, p.blocked)
	}
	return p.cur, nil
}

// checkExchange verifies with a passive declare, on a channel of its own,
// that exchange exists; a positive answer is cached for ExchangeCheckTTL.
// Both calls are bounded by CallTimeout, and end at until, the deadline of
// the publish they are made for. Called with pubMu held.
func (p *Publisher) checkExchange(s *session, exchange string, until time.Time) error {
	p.mu.Lock()
	at, ok := p.exchanges[exchange]
	p.mu.Unlock()
	if ok && time.Since(at) < p.cfg.ExchangeCheckTTL {
		return nil
	}
	p.uncork(s) // what is held must not wait for the answer
	if s.side == nil || s.side.IsClosed() {
		var side *amqp.Channel
		err := p.boundedUntil(s.conn, "open channel for exchange checks", until,
			func() (err error) { side, err = s.conn.Channel(); return err },
			func() { // the channel came after the deadline: nobody uses it
				if side != nil {
					p.closeChannel(s.conn, side)
				}
			})
		switch {
		case errors.Is(err, relay.ErrLeaseExpired):
			return err
		case err != nil:
			return fmt.Errorf("open channel for exchange checks: %w", err)
		}
		s.side = side
	}
	side := s.side
	err := p.boundedUntil(s.conn, "check exchange", until, func() error {
		return side.ExchangeDeclarePassive(exchange, "topic", false, false, false, false, nil)
	}, func() { p.closeChannel(s.conn, side) })
	var aerr *amqp.Error
	switch {
	case err == nil:
		p.mu.Lock()
		p.exchanges[exchange] = time.Now()
		p.mu.Unlock()
		return nil
	case errors.Is(err, relay.ErrLeaseExpired):
		s.side = nil // still waiting for its answer; closed once it comes
		return err
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		s.side = nil // the broker closed it
		return fmt.Errorf("%w: %q", relay.ErrExchangeNotFound, exchange)
	default:
		s.side = nil
		return fmt.Errorf("check exchange %q: %w", exchange, err)
	}
}

// publishing builds the AMQP message for m (docs/design.md, "The AMQP
// message"), with attempt as its wire.HeaderAttempt. Its headers are p's
// one table, emptied and filled again for every publish: the client
// library has encoded them by the time PublishWithContext returns, and
// keeps nothing of them. Called with pubMu held.
func (p *Publisher) publishing(m *relay.Message, attempt int64) amqp.Publishing {
	h := p.headers
	if h == nil {
		h = make(amqp.Table, len(m.Headers)+6)
		p.headers = h
	}
	clear(h)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[wire.HeaderKeySeq] = m.KeySeq
	h[wire.HeaderPrevKeySeq] = m.PrevKeySeq
	h[wire.HeaderPartition] = int32(m.Partition)
	h[wire.HeaderEpoch] = m.Epoch
	h[wire.HeaderAttempt] = attempt
	if m.Source != "" {
		h[wire.HeaderSource] = m.Source
	}
	return amqp.Publishing{
		Headers:       h,
		ContentType:   "application/json",
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.CorrelationID,
		MessageId:     m.ID.String(),
		Timestamp:     m.OccurredAt,
		Type:          m.Type,
		Body:          m.Payload,
	}
}
