// Package rabbitmq is the RabbitMQ backend of the relay: a relay.Publisher
// that owns one connection and one confirm-mode channel, publishes with
// mandatory and persistent delivery, and settles each message exactly once
// (returns drained before acks, Unsent on any close, Failed past the
// confirm timeout or for a missing exchange).
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/internal/redact"
	"github.com/ordo-relay/ordo/relay"
)

// Config configures an Publisher.
type Config struct {
	// URL of the broker, e.g. amqp://guest:guest@127.0.0.1:5672/, or a
	// comma-separated list of broker nodes: Run dials them in turn and,
	// after a failed dial or a lost connection, moves on to the next.
	URL string
	// Window is the most unconfirmed messages the relay keeps in flight; it
	// sizes the confirm and return buffers so the client library never has
	// to drop a notification.
	Window int
	// ReconnectMin and ReconnectMax bound the capped exponential backoff
	// between connection attempts.
	ReconnectMin, ReconnectMax time.Duration
	// ExchangeCheckTTL is how long a passive declare proving an exchange
	// exists is trusted before the exchange is checked again.
	ExchangeCheckTTL time.Duration
	// Heartbeat is the AMQP heartbeat interval; a dead broker is noticed
	// within about two of them.
	Heartbeat time.Duration
	// ConfirmTimeout is how long a publish may wait for its confirm on a
	// channel that stays open; past it the message is relay.Failed (an attempt
	// for its key), and a confirm that comes later is ignored.
	ConfirmTimeout time.Duration
	// Logger receives connection and outage messages.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Window <= 0 {
		c.Window = 512
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = time.Second
	}
	if c.ExchangeCheckTTL <= 0 {
		c.ExchangeCheckTTL = 10 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 5 * time.Second
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Publisher is the RabbitMQ relay.Publisher. It owns its connection: Run
// dials, opens a confirm-mode channel, and on any close treats every
// unconfirmed message as relay.Unsent, then reconnects with capped backoff. The
// client library's own recovery is not used.
type Publisher struct {
	cfg  Config
	down *outage.Log

	pubMu sync.Mutex // serialises delivery-tag assignment with the publish

	mu        sync.Mutex
	dialed    string   // the URL of the current or last connection
	cur       *session // nil while not connected
	exchanges map[string]time.Time
	opened    int64 // channels opened, for tests and status
	// isolate counts publishes still to be sent one at a time after the
	// broker closed a channel over one message (a channel-level error
	// other than a missing exchange): with a single message in flight, the
	// next such close names its culprit, which then fails instead of being
	// retried as relay.Unsent forever.
	isolate int
}

var _ relay.Publisher = (*Publisher)(nil)

// session is one confirm-mode channel and what is unconfirmed on it.
type session struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	pending map[uint64]*pendingPub // by delivery tag; guarded by Publisher.mu
	closed  bool                   // guarded by Publisher.mu
	side    *amqp.Channel          // for passive declares; guarded by pubMu
}

type pendingPub struct {
	msgID  string
	sent   time.Time
	settle func(relay.Result)
}

// ErrConfirmTimeout is the Err of a relay.Failed result whose confirm did not
// come within ConfirmTimeout on an open channel.
var ErrConfirmTimeout = errors.New("no publisher confirm within the confirm timeout")

// New returns a publisher; call Run to connect.
func New(cfg Config) *Publisher {
	cfg.setDefaults()
	return &Publisher{cfg: cfg, down: outage.New(cfg.Logger, "RabbitMQ"), exchanges: map[string]time.Time{}}
}

// Connected reports whether a channel is open.
func (p *Publisher) Connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur != nil
}

// URL returns the broker URL of the current or last connection, its
// password masked; empty before the first connection.
func (p *Publisher) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dialed
}

// ChannelsOpened returns how many publishing channels Run has opened.
func (p *Publisher) ChannelsOpened() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.opened
}

// Run keeps a connection and a confirm-mode channel open until ctx ends,
// then closes them, settling anything unconfirmed as relay.Unsent. It returns nil.
func (p *Publisher) Run(ctx context.Context) error {
	bo := backoff.New(p.cfg.ReconnectMin, p.cfg.ReconnectMax)
	urls := strings.Split(p.cfg.URL, ",")
	for next := 0; ctx.Err() == nil; next++ {
		url := strings.TrimSpace(urls[next%len(urls)])
		conn, err := amqp.DialConfig(url, amqp.Config{
			Heartbeat: p.cfg.Heartbeat,
			Locale:    "en_US",
			Dial:      amqp.DefaultDial(5 * time.Second),
		})
		if err != nil {
			if _, perr := amqp.ParseURI(url); perr != nil {
				// The parse error quotes the whole URL, password included.
				err = fmt.Errorf("the AMQP URL %s does not parse", redact.URL(url))
			}
			p.down.Fail(fmt.Errorf("dial: %w", err))
			backoff.Sleep(ctx, bo.Next())
			continue
		}
		p.mu.Lock()
		p.dialed = redact.URL(url)
		p.mu.Unlock()
		before := p.ChannelsOpened()
		err = p.serveConn(ctx, conn) // when it is lost, the loop moves on to the next URL
		conn.Close()
		if ctx.Err() != nil {
			return nil
		}
		if p.ChannelsOpened() > before {
			bo.Reset() // it worked: the next outage starts the backoff over
		}
		p.down.Fail(err)
		if !backoff.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
	return nil
}

// serveConn opens channels on conn until the connection fails or ctx ends.
func (p *Publisher) serveConn(ctx context.Context, conn *amqp.Connection) error {
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	for {
		err := p.serveChannel(ctx, conn, connClosed)
		if ctx.Err() != nil || conn.IsClosed() {
			return err
		}
		var aerr *amqp.Error
		if !errors.As(err, &aerr) || !aerr.Recover {
			return err
		}
		if aerr.Code == amqp.NotFound {
			// A publish to a missing exchange closed the channel. Forget
			// what we knew about exchanges so the next publish to each is
			// checked again.
			p.mu.Lock()
			clear(p.exchanges)
			p.mu.Unlock()
		}
		p.cfg.Logger.Warn("RabbitMQ closed the channel; reopening", "err", err)
	}
}

func (p *Publisher) serveChannel(ctx context.Context, conn *amqp.Connection, connClosed <-chan *amqp.Error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return fmt.Errorf("confirm mode: %w", err)
	}
	buf := 2*p.cfg.Window + 16
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, buf))
	returns := ch.NotifyReturn(make(chan amqp.Return, buf))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))

	s := &session{conn: conn, ch: ch, pending: map[uint64]*pendingPub{}}
	p.mu.Lock()
	p.cur = s
	p.opened++
	p.mu.Unlock()
	p.down.OK()
	p.cfg.Logger.Info("RabbitMQ channel open")

	returned := map[string]error{}
	drainReturns := func() {
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					return
				}
				returned[r.MessageId] = fmt.Errorf("returned by broker: %d %s (exchange %q, routing key %q)",
					r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
			default:
				return
			}
		}
	}
	settle := func(c amqp.Confirmation) {
		p.mu.Lock()
		pp, ok := s.pending[c.DeliveryTag]
		delete(s.pending, c.DeliveryTag)
		p.mu.Unlock()
		if !ok {
			return
		}
		// The broker sends basic.return before the ack, and the library
		// hands both over from one goroutine in that order: any return for
		// this message is already buffered.
		drainReturns()
		switch rerr, wasReturned := returned[pp.msgID]; {
		case wasReturned:
			delete(returned, pp.msgID)
			pp.settle(relay.Result{Outcome: relay.Returned, Err: rerr})
		case !c.Ack:
			pp.settle(relay.Result{Outcome: relay.Nacked, Err: errors.New("nacked by broker")})
		default:
			pp.settle(relay.Result{Outcome: relay.Confirmed})
		}
	}

	expire := time.NewTicker(max(p.cfg.ConfirmTimeout/4, 10*time.Millisecond))
	defer expire.Stop()
	var cause error
loop:
	for {
		select {
		case <-ctx.Done():
			cause = ctx.Err()
			break loop
		case now := <-expire.C:
			p.expire(s, now)
		case r, ok := <-returns:
			if ok {
				returned[r.MessageId] = fmt.Errorf("returned by broker: %d %s (exchange %q, routing key %q)",
					r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
			}
		case c, ok := <-confirms:
			if !ok {
				cause = errors.New("channel closed")
				break loop
			}
			settle(c)
		case e := <-chClosed:
			if e != nil {
				cause = e
			} else {
				cause = errors.New("channel closed")
			}
			break loop
		case e := <-connClosed:
			cause = fmt.Errorf("connection closed: %v", e)
			break loop
		}
	}

	// Stop new publishes on this session, then settle what the library
	// still delivered, then everything else as relay.Unsent.
	p.pubMu.Lock()
	p.mu.Lock()
	s.closed = true
	p.cur = nil
	p.mu.Unlock()
	if s.side != nil {
		s.side.Close()
	}
	p.pubMu.Unlock()
	ch.Close()
	for c := range confirms { // closed by the library when the channel closes
		settle(c)
	}
	var aerr *amqp.Error
	soft := errors.As(cause, &aerr) && aerr.Recover && aerr.Code != amqp.NotFound && !conn.IsClosed()
	p.mu.Lock()
	rest := s.pending
	s.pending = nil
	isolating := p.isolate > 0
	if soft {
		// Send the next publishes one at a time, enough of them to get past
		// everything that was in flight.
		p.isolate = 2*len(rest) + 16
	}
	p.mu.Unlock()
	for _, pp := range rest {
		if soft && isolating && len(rest) == 1 {
			// Alone in flight when the broker closed the channel: it is
			// the cause. A failure, so it backs off and is parked.
			pp.settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("the broker closed the channel over this message: %w", cause)})
			continue
		}
		pp.settle(relay.Result{Outcome: relay.Unsent, Err: fmt.Errorf("unconfirmed when the channel closed: %w", cause)})
	}
	if len(rest) > 0 {
		p.cfg.Logger.Info("unconfirmed messages will be republished", "count", len(rest))
	}
	return cause
}

// waitIsolated, while isolating, waits until nothing is unconfirmed on s.
// Called with pubMu held; the serve loop settles confirms without it.
func (p *Publisher) waitIsolated(ctx context.Context, s *session) error {
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
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// expire fails the publishes of s waiting longer than ConfirmTimeout.
func (p *Publisher) expire(s *session, now time.Time) {
	var late []*pendingPub
	p.mu.Lock()
	for tag, pp := range s.pending {
		if now.Sub(pp.sent) >= p.cfg.ConfirmTimeout {
			late = append(late, pp)
			delete(s.pending, tag)
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

// Publish implements relay.Publisher.
func (p *Publisher) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	if err := checkSendable(m); err != nil {
		// The client or the broker would reject it by closing the channel
		// or the connection: the message would be retried as Unsent
		// forever, without ever counting an attempt.
		settle(relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("%w: %w", ErrUnsendable, err)})
		return nil
	}
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	p.mu.Lock()
	s := p.cur
	p.mu.Unlock()
	if s == nil {
		return relay.ErrNotConnected
	}
	if m.Exchange != "" {
		if err := p.checkExchange(s, m.Exchange); err != nil {
			if errors.Is(err, relay.ErrExchangeNotFound) {
				settle(relay.Result{Outcome: relay.Failed, Err: err})
				return nil
			}
			return err
		}
	}
	if err := p.waitIsolated(ctx, s); err != nil {
		return err
	}
	tag := s.ch.GetNextPublishSeqNo()
	msgID := m.ID.String()
	p.mu.Lock()
	if s.closed {
		p.mu.Unlock()
		return relay.ErrNotConnected
	}
	if p.isolate > 0 {
		p.isolate--
	}
	s.pending[tag] = &pendingPub{msgID: msgID, sent: time.Now(), settle: settle}
	p.mu.Unlock()

	err := s.ch.PublishWithContext(ctx, m.Exchange, m.RoutingKey, true, false, publishing(m))
	if err != nil {
		p.mu.Lock()
		_, mine := s.pending[tag]
		delete(s.pending, tag)
		p.mu.Unlock()
		if !mine {
			return nil // the closing session settled it already
		}
		return fmt.Errorf("publish: %w", err)
	}
	return nil
}

// checkExchange verifies with a passive declare, on a channel of its own,
// that exchange exists; a positive answer is cached for ExchangeCheckTTL.
// Called with pubMu held.
func (p *Publisher) checkExchange(s *session, exchange string) error {
	p.mu.Lock()
	at, ok := p.exchanges[exchange]
	p.mu.Unlock()
	if ok && time.Since(at) < p.cfg.ExchangeCheckTTL {
		return nil
	}
	if s.side == nil || s.side.IsClosed() {
		side, err := s.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel for exchange checks: %w", err)
		}
		s.side = side
	}
	err := s.side.ExchangeDeclarePassive(exchange, "topic", false, false, false, false, nil)
	var aerr *amqp.Error
	switch {
	case err == nil:
		p.mu.Lock()
		p.exchanges[exchange] = time.Now()
		p.mu.Unlock()
		return nil
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		s.side = nil // the broker closed it
		return fmt.Errorf("%w: %q", relay.ErrExchangeNotFound, exchange)
	default:
		s.side = nil
		return fmt.Errorf("check exchange %q: %w", exchange, err)
	}
}

// publishing builds the AMQP message for m (DESIGN.md, "The AMQP message").
func publishing(m *relay.Message) amqp.Publishing {
	h := make(amqp.Table, len(m.Headers)+4)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[relay.HeaderKeySeq] = m.KeySeq
	h[relay.HeaderPrevKeySeq] = m.PrevKeySeq
	h[relay.HeaderPartition] = int32(m.Partition)
	h[relay.HeaderEpoch] = m.Epoch
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

// ErrUnsendable is the Err of a Failed result for a message AMQP cannot
// carry (a header name over 255 bytes, a header value or payload over the
// limits below); it was not sent.
var ErrUnsendable = errors.New("message cannot be sent over AMQP")

// Limits below the broker's defaults (frame_max 128 KiB for all headers
// together, max_message_size 16 MiB on RabbitMQ 4).
const (
	maxHeaderBytes  = 64 << 10
	maxPayloadBytes = 16 << 20
)

// checkSendable refuses what the AMQP client or the broker would reject
// by closing the channel or the connection.
func checkSendable(m *relay.Message) error {
	for k, v := range m.Headers {
		if len(k) > 255 {
			return fmt.Errorf("header name of %d bytes (AMQP allows 255)", len(k))
		}
		if s, ok := v.(string); ok && len(s) > maxHeaderBytes {
			return fmt.Errorf("header %q of %d bytes (at most %d)", k, len(s), maxHeaderBytes)
		}
	}
	if len(m.Payload) > maxPayloadBytes {
		return fmt.Errorf("payload of %d bytes (at most %d)", len(m.Payload), maxPayloadBytes)
	}
	return nil
}
