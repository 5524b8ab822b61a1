// Package rabbitmq is the RabbitMQ backend of the relay: a relay.Publisher
// that owns one connection and one confirm-mode channel, publishes with
// mandatory and persistent delivery, and settles each message exactly once
// (returns matched to their publish before acks, Unsent on any close,
// Failed past the confirm timeout or for a missing exchange). It pauses
// while the broker blocks the connection (a resource alarm), closes a link
// that stops confirming, and bounds every call that waits for the broker.
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/internal/redact"
	"github.com/ordo-relay/ordo/relay"
)

// Publisher is the RabbitMQ relay.Publisher. It owns its connection: Run
// dials, opens a confirm-mode channel, and on any close treats every
// unconfirmed message as relay.Unsent, then reconnects with capped backoff. The
// client library's own recovery is not used.
type Publisher struct {
	cfg  Config
	down *outage.Log

	pubMu   sync.Mutex     // serialises delivery-tag assignment with the publish
	headers amqp.Table     // the headers of the publish under way (publishing); guarded by pubMu
	calls   sync.WaitGroup // bounded broker calls still running; Run waits for them
	attempt atomic.Int64   // the last wire.HeaderAttempt value used

	mu        sync.Mutex
	dialed    string   // the URL of the current or last connection
	cur       *session // nil while not connected
	exchanges map[string]time.Time
	opened    int64 // channels opened, for tests and status
	stalls    int64 // links closed because they stopped confirming
	// isolate counts publishes still to be sent one at a time after the
	// broker closed a channel, or the whole connection, over one message
	// (a channel-level error other than a missing exchange, or a 5xx
	// connection error): with a single message in flight, the next such
	// close names its culprit, which then fails instead of being retried
	// as relay.Unsent forever.
	isolate int
	// blocked is the broker's reason while it blocks the connection
	// (connection.blocked: a memory or disk alarm), empty otherwise;
	// blockedAt is when it started.
	blocked   string
	blockedAt time.Time

	// noFrameCheck lets a message over frame_max reach the broker, for
	// the test of connection errors; set it before the first Publish.
	noFrameCheck bool
	// beforeWrite, if set, runs in Publish after its last wait and right
	// before the last deadline check: tests pause there, as a node
	// paused by the scheduler or a stop-the-world would. Set it before
	// the first Publish.
	beforeWrite func()
}

var (
	_ relay.Publisher = (*Publisher)(nil)
	_ relay.Flusher   = (*Publisher)(nil)
)

// ErrConfirmTimeout is the Err of a relay.Failed result whose confirm did not
// come within ConfirmTimeout on an open channel.
var ErrConfirmTimeout = errors.New("no publisher confirm within the confirm timeout")

// ErrBlocked is returned (wrapping relay.ErrNotConnected) by Publish while
// the broker blocks the connection because of a resource alarm.
var ErrBlocked = fmt.Errorf("%w: the broker blocks publishing (resource alarm)", relay.ErrNotConnected)

// ErrCallTimeout is returned (wrapped) when the broker did not answer a
// call within CallTimeout; the connection was closed.
var ErrCallTimeout = errors.New("no answer from the broker within the call timeout")

// New returns a publisher; call Run to connect. Zero fields of cfg (but
// StallTimeout, where zero turns the check off, and ConnectionName and
// CloudEventsSource) take their DefaultConfig value; New refuses a cfg
// that Validate then refuses.
func New(cfg Config) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newPublisher(cfg), nil
}

// newPublisher returns a publisher of cfg as it is.
func newPublisher(cfg Config) *Publisher {
	return &Publisher{cfg: cfg, down: outage.New(cfg.Logger, "RabbitMQ"), exchanges: map[string]time.Time{}}
}

// Connected reports whether a channel is open and the broker does not
// block it: whether a publish can go out now.
func (p *Publisher) Connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur != nil && p.blocked == ""
}

// Blocked reports whether the broker blocks the connection now (a
// resource alarm). Safe for concurrent use.
func (p *Publisher) Blocked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked != ""
}

// State is what Status reports.
type State struct {
	// Connected: a confirm-mode channel is open.
	Connected bool `json:"connected"`
	// Blocked is the broker's reason while it blocks the connection
	// (e.g. "low on memory"), empty otherwise; BlockedSeconds is for how
	// long.
	Blocked        string  `json:"blocked,omitempty"`
	BlockedSeconds float64 `json:"blockedSeconds,omitempty"`
	// ChannelsOpened and Stalls count channels opened and links closed
	// because they stopped confirming, since the start.
	ChannelsOpened int64 `json:"channelsOpened"`
	Stalls         int64 `json:"stalls"`
}

// Status returns the publisher's state. Safe for concurrent use.
func (p *Publisher) Status() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := State{Connected: p.cur != nil, Blocked: p.blocked, ChannelsOpened: p.opened, Stalls: p.stalls}
	if p.blocked != "" {
		s.BlockedSeconds = time.Since(p.blockedAt).Seconds()
	}
	return s
}

// URL returns the broker URL of the current or last connection, its
// password masked; empty before the first connection.
func (p *Publisher) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dialed
}

// Run keeps a connection and a confirm-mode channel open until ctx ends,
// then closes them, settling anything unconfirmed as relay.Unsent, and
// returns nil. Broker outages are retried, not returned; Run returns an
// error at once only for a URL that does not parse, which no retry can
// fix.
func (p *Publisher) Run(ctx context.Context) error {
	defer p.calls.Wait()
	bo := backoff.New(p.cfg.ReconnectMin, p.cfg.ReconnectMax)
	urls := strings.Split(p.cfg.URL, ",")
	for _, url := range urls {
		if _, err := amqp.ParseURI(strings.TrimSpace(url)); err != nil {
			// The parse error quotes the whole URL, password included.
			return fmt.Errorf("the AMQP URL %s does not parse", redact.URL(url))
		}
	}
	for next := 0; ctx.Err() == nil; next++ {
		url := strings.TrimSpace(urls[next%len(urls)])
		var raw *corkConn // the TCP connection, for corking and the publish watchdog
		// A fresh table for every dial: the library writes into it.
		props := amqp.NewConnectionProperties()
		if p.cfg.ConnectionName != "" {
			props.SetClientConnectionName(p.cfg.ConnectionName)
		}
		conn, err := amqp.DialConfig(url, amqp.Config{
			Heartbeat:  p.cfg.Heartbeat,
			Locale:     "en_US",
			Dial:       keepConn(&raw, amqp.DefaultDial(5*time.Second)),
			Properties: props,
		})
		if err != nil {
			p.down.Fail(fmt.Errorf("dial: %w", err))
			backoff.Sleep(ctx, bo.Next())
			continue
		}
		p.mu.Lock()
		p.dialed = redact.URL(url)
		p.mu.Unlock()
		up := time.Now()
		published, err := p.serveConn(ctx, conn, raw) // when it is lost, the loop moves on to the next URL
		if ctx.Err() != nil {
			return nil
		}
		if published && time.Since(up) >= p.cfg.StableAfter {
			bo.Reset() // it worked: the next outage starts the backoff over
		}
		p.down.Fail(err)
		if !backoff.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
	return nil
}

// serveConn opens channels on conn (whose TCP connection is raw) until the
// connection fails or ctx ends, then closes it. published reports whether
// a publish was confirmed on it.
func (p *Publisher) serveConn(ctx context.Context, conn *amqp.Connection, raw *corkConn) (published bool, err error) {
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blockedDone := p.watchBlocked(conn)
	defer func() {
		p.closeConn(conn, p.cfg.CallTimeout)
		<-blockedDone
		p.setBlocked(amqp.Blocking{}) // whatever the old connection said
	}()
	frameMax := conn.Config.FrameSize
	for {
		confirmed, err := p.serveChannel(ctx, conn, raw, connClosed, frameMax)
		published = published || confirmed
		if ctx.Err() != nil || conn.IsClosed() {
			return published, err
		}
		var aerr *amqp.Error
		if !errors.As(err, &aerr) || !aerr.Recover {
			return published, err
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

// watchBlocked follows the broker's connection.blocked and unblocked
// notifications on conn until it closes; the returned channel is closed
// then. It reads them at once: amqp091-go drops a notification nobody
// takes within 5 s, and a lost "unblocked" would pause the node for good.
func (p *Publisher) watchBlocked(conn *amqp.Connection) <-chan struct{} {
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := range blocked { // closed by the library with the connection
			p.setBlocked(b)
		}
	}()
	return done
}

// setBlocked records a blocked or unblocked notification. When a block
// ends, the publishes that waited through it get the time back: the
// confirm timeout and the stall clock do not run while blocked.
func (p *Publisher) setBlocked(b amqp.Blocking) {
	now := time.Now()
	p.mu.Lock()
	was, since := p.blocked, p.blockedAt
	switch {
	case b.Active:
		if was == "" {
			p.blockedAt = now
		}
		p.blocked = b.Reason
		if p.blocked == "" {
			p.blocked = "blocked"
		}
	case was != "":
		p.blocked = ""
		if s := p.cur; s != nil {
			s.resume(now.Sub(since))
		}
	}
	p.mu.Unlock()
	switch {
	case b.Active && was == "":
		p.cfg.Logger.Warn("RabbitMQ blocks publishing (resource alarm); pausing, no attempt is counted while it lasts", "reason", b.Reason)
	case !b.Active && was != "":
		p.cfg.Logger.Info("RabbitMQ publishing unblocked; resuming", "blocked_for", now.Sub(since).Round(time.Millisecond))
	}
}

// closeConn closes conn, waiting at most timeout for the broker's answer.
func (p *Publisher) closeConn(conn *amqp.Connection, timeout time.Duration) {
	if !conn.IsClosed() {
		_ = conn.CloseDeadline(time.Now().Add(timeout))
	}
}
