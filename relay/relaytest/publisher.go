package relaytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/relay"
)

// Publisher is an in-memory relay.Publisher that a test drives: by default
// it confirms every message at once; on command it nacks, returns or fails
// chosen messages, holds confirms until released (in order or not),
// closes its channel or connection (settling what is unconfirmed as
// Unsent), refuses publishes while disconnected, and blocks publishes as a
// broker under a resource alarm does. It records every message sent, in
// order. Like every Publisher it sends nothing after a message's
// Deadline: a blocked publish ends at it. Safe for concurrent use.
type Publisher struct {
	mu        sync.Mutex
	connected bool
	hold      bool
	fault     func(*relay.Message) (relay.Result, bool)
	pending   []held
	sent      []relay.Message
	delivered []relay.Message
	blocked   chan struct{} // non-nil while blocked; closed to unblock
	maxHeld   int
	async     sync.WaitGroup
	delay     time.Duration
	// beforeSend runs after a publish's waits, right before its last
	// deadline check (SetBeforeSend).
	beforeSend func(*relay.Message)
}

type held struct {
	m      relay.Message
	settle func(relay.Result)
}

var _ relay.Publisher = (*Publisher)(nil)

// NewPublisher returns a connected publisher that confirms everything.
func NewPublisher() *Publisher { return &Publisher{connected: true} }

// Publish implements relay.Publisher.
func (p *Publisher) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	p.mu.Lock()
	for p.blocked != nil {
		b := p.blocked
		p.mu.Unlock()
		if err := waitUnblocked(ctx, b, m.Deadline); err != nil {
			return err
		}
		p.mu.Lock()
	}
	if !p.connected {
		p.mu.Unlock()
		return relay.ErrNotConnected
	}
	if hook := p.beforeSend; hook != nil {
		p.mu.Unlock()
		hook(m)
		p.mu.Lock()
	}
	if m.Expired(time.Now()) {
		p.mu.Unlock()
		return fmt.Errorf("%w (relaytest: before the send)", relay.ErrLeaseExpired)
	}
	p.sent = append(p.sent, *m)
	settle = p.recording(*m, settle)
	if p.fault != nil {
		if res, ok := p.fault(m); ok {
			delay := p.delay
			p.mu.Unlock()
			if delay == 0 {
				settle(res)
				return nil
			}
			p.async.Add(1)
			go func() {
				defer p.async.Done()
				time.Sleep(delay)
				settle(res)
			}()
			return nil
		}
	}
	if p.hold {
		p.pending = append(p.pending, held{*m, settle})
		p.maxHeld = max(p.maxHeld, len(p.pending))
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	settle(relay.Result{Outcome: relay.Confirmed})
	return nil
}

// waitUnblocked waits until b is closed, ctx ends or deadline (zero:
// none) passes.
func waitUnblocked(ctx context.Context, b <-chan struct{}, deadline time.Time) error {
	var lapsed <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		lapsed = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-lapsed:
		return fmt.Errorf("%w (relaytest: blocked)", relay.ErrLeaseExpired)
	case <-b:
		return nil
	}
}

// SetBeforeSend makes f run in every publish after its waits, right
// before its last deadline check (nil: nothing): a pause there is a
// node paused between its checks and the write.
func (p *Publisher) SetBeforeSend(f func(*relay.Message)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.beforeSend = f
}

// recording wraps settle so confirmed messages are recorded as delivered.
func (p *Publisher) recording(m relay.Message, settle func(relay.Result)) func(relay.Result) {
	return func(res relay.Result) {
		if res.Outcome == relay.Confirmed {
			p.mu.Lock()
			p.delivered = append(p.delivered, m)
			p.mu.Unlock()
		}
		settle(res)
	}
}

// Connected implements relay.Publisher.
func (p *Publisher) Connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connected
}

// SetFault makes f decide the outcome of each message sent from now on:
// when it returns true, the message settles at once with the result given;
// otherwise it is confirmed (or held). Nil clears it.
func (p *Publisher) SetFault(f func(*relay.Message) (relay.Result, bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// SetFaultDelay makes the results SetFault decides arrive after d, from
// another goroutine, as a broker's nacks and returns do, instead of before
// Publish returns. Wait for them with Quiesce.
func (p *Publisher) SetFaultDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Quiesce waits for delayed results to be delivered.
func (p *Publisher) Quiesce() { p.async.Wait() }

// Hold makes confirms wait until Release, ReleaseReversed or Close.
func (p *Publisher) Hold(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = on
}

// Held returns how many messages wait for their confirm now, and the most
// that ever waited at once.
func (p *Publisher) Held() (now, most int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending), p.maxHeld
}

// HeldMessages returns the messages waiting for their confirm.
func (p *Publisher) HeldMessages() []relay.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]relay.Message, len(p.pending))
	for i, h := range p.pending {
		out[i] = h.m
	}
	return out
}

// Release settles up to n held messages, oldest first, with res.
func (p *Publisher) Release(n int, res relay.Result) int {
	return p.release(n, res, false)
}

// ReleaseID settles the held message id with res, and reports whether it
// was held.
func (p *Publisher) ReleaseID(id uuid.UUID, res relay.Result) bool {
	p.mu.Lock()
	i := slices.IndexFunc(p.pending, func(h held) bool { return h.m.ID == id })
	if i < 0 {
		p.mu.Unlock()
		return false
	}
	h := p.pending[i]
	p.pending = slices.Delete(p.pending, i, i+1)
	p.mu.Unlock()
	h.settle(res)
	return true
}

// ReleaseReversed settles every held message with res, newest first, as a
// broker's multiple ack may reach the relay's waiters in any order.
func (p *Publisher) ReleaseReversed(res relay.Result) int {
	return p.release(-1, res, true)
}

func (p *Publisher) release(n int, res relay.Result, reversed bool) int {
	p.mu.Lock()
	if n < 0 || n > len(p.pending) {
		n = len(p.pending)
	}
	var out []held
	if reversed {
		out = slices.Clone(p.pending[len(p.pending)-n:])
		slices.Reverse(out)
		p.pending = p.pending[:len(p.pending)-n]
	} else {
		out = slices.Clone(p.pending[:n])
		p.pending = p.pending[n:]
	}
	p.mu.Unlock()
	for _, h := range out {
		h.settle(res)
	}
	return len(out)
}

// ErrChannelClosed is the Err of the Unsent results Close gives.
var ErrChannelClosed = errors.New("relaytest: channel closed")

// Close drops the channel (connection false: the channel only; true: the
// whole connection, which stays down until Reconnect): every held message
// settles Unsent.
func (p *Publisher) Close(connection bool) {
	p.mu.Lock()
	if connection {
		p.connected = false
	}
	p.mu.Unlock()
	p.release(-1, relay.Result{Outcome: relay.Unsent, Err: ErrChannelClosed}, false)
}

// Reconnect brings a closed connection back.
func (p *Publisher) Reconnect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.connected = true
}

// Block makes Publish wait, as under a broker resource alarm, until
// Unblock, the publish's context ends or its message's Deadline passes.
func (p *Publisher) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked == nil {
		p.blocked = make(chan struct{})
	}
}

// Unblock ends a Block.
func (p *Publisher) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked != nil {
		close(p.blocked)
		p.blocked = nil
	}
}

// Delivered returns every message confirmed so far, in the order of their
// confirms: what a consumer of the broker would have received.
func (p *Publisher) Delivered() []relay.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.delivered)
}

// Sent returns every message sent so far, in the order sent.
func (p *Publisher) Sent() []relay.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sent)
}
