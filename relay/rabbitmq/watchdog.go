package rabbitmq

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/relay"
)

// How a publish keeps to its lease deadline (relay.Message.Deadline).
//
// The relay checks the lease when it takes a row, but the publish then
// waits: for the publish lock, for the answer to a passive declare, for
// earlier confirms while isolating a broker error. Any of these can
// outlast the lease, and meanwhile another node may claim the partition
// and publish the key's next row. So Publish checks the deadline after
// each wait and right before it writes, and every wait for the broker
// ends at the deadline (boundedUntil).
//
// amqp091-go cannot check a deadline inside a write: PublishWithContext
// looks at its context once, before it starts, and the write itself can
// block in the socket (TCP back-pressure, a broker that stopped reading).
// So the write runs under a watchdog that, at the deadline, resets the
// TCP connection: closing the channel would not do, since channel.close
// is a frame on the same socket and waits behind the blocked write. A
// reset (RST, linger 0) also drops what still sits in this side's send
// buffer, so nothing of the message leaves after the deadline. The other
// publishes in flight on the connection are settled Unsent (retried, not
// charged), and Run dials again as after any lost connection. Bytes that
// already reached the broker's side before the deadline cannot be called
// back (docs/design.md, "Known limits").

// leaseExpired is the error of a publish whose deadline passed during
// what.
func leaseExpired(what string) error {
	return fmt.Errorf("%w (%s)", relay.ErrLeaseExpired, what)
}

// bounded runs f, a call that waits for the broker, for at most
// CallTimeout. Past it, it closes conn, which ends f, and returns an error
// wrapping ErrCallTimeout without waiting for f (Run does, before it
// returns).
func (p *Publisher) bounded(conn *amqp.Connection, what string, f func() error) error {
	return p.boundedUntil(conn, what, time.Time{}, f, nil)
}

// boundedUntil is bounded, for a call made for a publish whose lease
// deadline is until (zero: none). At the deadline it returns an error
// wrapping relay.ErrLeaseExpired at once and leaves f behind, still
// bounded by CallTimeout; abandoned, if not nil, runs once f has returned
// (to close what f opened or used, which nobody else will).
func (p *Publisher) boundedUntil(conn *amqp.Connection, what string, until time.Time, f func() error, abandoned func()) error {
	started := time.Now()
	done := make(chan error, 1)
	p.calls.Add(1)
	go func() {
		defer p.calls.Done()
		done <- f()
	}()
	timeout := time.NewTimer(p.cfg.CallTimeout)
	defer timeout.Stop()
	var lapsed <-chan time.Time
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		lapsed = t.C
	}
	select {
	case err := <-done:
		return err
	case <-timeout.C:
		p.closeConn(conn, 0)
		return fmt.Errorf("%s: %w (%v); connection closed", what, ErrCallTimeout, p.cfg.CallTimeout)
	case <-lapsed:
	}
	p.calls.Add(1)
	go func() {
		defer p.calls.Done()
		t := time.NewTimer(p.cfg.CallTimeout - time.Since(started))
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			p.closeConn(conn, 0)
			<-done
		}
		if abandoned != nil {
			abandoned()
		}
	}()
	return leaseExpired(what)
}

// watchdog resets its session's TCP connection if a write is still under
// way at the deadline it was armed with. One per session, reused by every
// write (writes are serialised by pubMu): a stopped timer made again costs
// more than the write it guards.
type watchdog struct {
	timer   *time.Timer
	writing atomic.Pointer[relay.Message] // the message being written, for the log
}

// newWatchdog returns s's watchdog, disarmed.
func (p *Publisher) newWatchdog(s *session) *watchdog {
	w := &watchdog{}
	w.timer = time.AfterFunc(time.Hour, func() {
		defer p.calls.Done()
		p.cutOff(s, w.writing.Load())
	})
	w.timer.Stop()
	return w
}

// watched runs write, the write of m to s, under s's watchdog, which
// resets s's TCP connection if m's deadline comes before write returns.
// cut reports whether it did. Called with pubMu held.
func (p *Publisher) watched(s *session, m *relay.Message, write func() error) (cut bool, err error) {
	if m.Deadline.IsZero() {
		return false, write()
	}
	w := s.dog
	w.writing.Store(m)
	p.calls.Add(1) // done by the timer's function, or below if it never runs
	w.timer.Reset(time.Until(m.Deadline))
	err = write()
	if w.timer.Stop() {
		p.calls.Done()
		return false, err
	}
	return true, err
}

// cutOff resets s's connection because m's lease deadline came while m
// was being written.
func (p *Publisher) cutOff(s *session, m *relay.Message) {
	p.cfg.Logger.Warn("the lease deadline passed while a publish was being written; resetting the broker connection so that it cannot complete",
		"partition", m.Partition, "epoch", m.Epoch, "id", m.ID)
	var tc *net.TCPConn
	if s.raw != nil {
		tc, _ = s.raw.Conn.(*net.TCPConn)
	}
	if tc == nil {
		p.closeConn(s.conn, 0)
		return
	}
	_ = tc.SetLinger(0) // RST: what is still in the send buffer is dropped
	_ = tc.Close()
}
