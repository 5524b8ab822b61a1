package testkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyDialTimeout bounds how long the proxy waits for the target to accept
// a forwarded connection.
const proxyDialTimeout = 10 * time.Second

// Proxy is an in-process TCP proxy in front of a real server, used to
// simulate outages per test: Cut drops every forwarded connection and makes
// new ones fail, Restore lets connections through again. The server itself
// is never touched, so other tests sharing it are unaffected.
//
// All methods are safe for concurrent use. The proxy is closed when the test
// that created it ends: its listener and every forwarded connection are
// closed and all its goroutines have returned before cleanup continues.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled on close; aborts dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and one per forwarded connection

	mu     sync.Mutex
	links  map[*proxyLink]struct{}
	cut    bool
	cuts   int
	gen    uint64 // incremented by every Cut; a link dialled across a Cut is dropped
	closed bool

	stall atomic.Pointer[chan struct{}] // non-nil while stalled; closed by Resume

	// replyDelay is how long each byte from the target waits before it
	// is forwarded to the client (DelayReplies); delayChanged is closed,
	// and replaced, whenever it changes, so that waiting bytes see the
	// new value at once.
	replyDelay   atomic.Int64
	delayChanged atomic.Pointer[chan struct{}]
	// replyRate, when above 0, is how many bytes a second each connection
	// forwards from the target (LimitReplies).
	replyRate atomic.Int64
}

// proxyLink is one forwarded connection: the client's side and the target's.
type proxyLink struct {
	client, server net.Conn
	once           sync.Once
}

// abort closes both sides at once. With abrupt set, it resets them (linger
// 0) so peers see a failure, as when a network or server goes away.
func (l *proxyLink) abort(abrupt bool) {
	l.once.Do(func() {
		closeConn(l.client, abrupt)
		closeConn(l.server, abrupt)
	})
}

// closeConn closes c; with abrupt set it resets the TCP connection (linger
// 0) instead of ending it cleanly.
func closeConn(c net.Conn, abrupt bool) {
	if tc, ok := c.(*net.TCPConn); ok && abrupt {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// NewProxy starts a proxy listening on 127.0.0.1 (a free port) that forwards
// every accepted connection to target ("host:port"). It is closed, and its
// goroutines waited for, when tb ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := StartProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// StartProxy is NewProxy for programs without a testing.TB (the bench):
// the caller must Close it.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: listen: %w", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		links:  map[*proxyLink]struct{}{},
	}
	changed := make(chan struct{})
	p.delayChanged.Store(&changed)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns rawURL with its host and port replaced by the proxy's address,
// keeping scheme, user, path and query: a postgres:// or amqp:// URL of the
// target becomes one that goes through the proxy. It panics when rawURL does
// not parse, which is a bug in the test.
func (p *Proxy) URL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic("testkit: Proxy.URL: " + err.Error())
	}
	u.Host = p.Addr()
	return u.String()
}

// Cut simulates an outage: it resets every forwarded connection at once and,
// until Restore, accepts new connections only to reset them immediately, so
// clients fail fast instead of hanging. Calling Cut while already cut does
// nothing.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		return
	}
	p.cut = true
	p.cuts++
	p.gen++
	links := p.takeLinksLocked()
	p.mu.Unlock()
	for _, l := range links {
		l.abort(true)
	}
}

// Restore ends an outage started by Cut: new connections are forwarded
// again. Connections cut before stay closed. Calling Restore when not cut
// does nothing.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Cuts returns how many times Cut has started an outage.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// takeLinksLocked empties the set of open links and returns them.
func (p *Proxy) takeLinksLocked() []*proxyLink {
	links := make([]*proxyLink, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
		delete(p.links, l)
	}
	return links
}

// Close stops accepting, closes every link and waits for all goroutines.
// NewProxy calls it when the test ends; it is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	links := p.takeLinksLocked()
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	for _, l := range links {
		l.abort(false)
	}
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Temporary resource errors (EMFILE and the like): back off
			// briefly, unless the proxy is closing.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		if p.closed || p.cut {
			p.mu.Unlock()
			closeConn(c, true)
			continue
		}
		gen := p.gen
		p.wg.Add(1)
		p.mu.Unlock()
		go p.forward(c, gen)
	}
}

// forward dials the target for client and copies bytes both ways until
// either side ends or the link is cut.
func (p *Proxy) forward(client net.Conn, gen uint64) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: proxyDialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		closeConn(client, true)
		return
	}
	l := &proxyLink{client: client, server: server}
	p.mu.Lock()
	if p.closed || p.cut || p.gen != gen {
		// Cut (or closed) while dialling: this connection belongs to the
		// outage.
		p.mu.Unlock()
		l.abort(true)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pipe(l, server, client)
	}()
	p.pipeReplies(l, client, server)
	<-done
	l.abort(false)

	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pipe copies src to dst, holding data back while the proxy is stalled. At
// a clean end of src it half-closes dst so the other direction can finish;
// on an error it aborts the whole link.
func (p *Proxy) pipe(l *proxyLink, dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, rerr := src.Read(buf)
		if n > 0 && !p.send(l, dst, buf[:n]) {
			return
		}
		if rerr != nil {
			p.end(l, dst, rerr)
			return
		}
	}
}

// send writes b to dst once the proxy is not stalled; on failure it
// aborts the link and reports false.
func (p *Proxy) send(l *proxyLink, dst net.Conn, b []byte) bool {
	if g := p.stall.Load(); g != nil {
		select {
		case <-*g:
		case <-p.ctx.Done():
			l.abort(false)
			return false
		}
	}
	if _, err := dst.Write(b); err != nil {
		l.abort(false)
		return false
	}
	return true
}

// end finishes a direction whose source ended with err: a clean end
// half-closes dst so the other direction can finish; anything else aborts
// the link.
func (p *Proxy) end(l *proxyLink, dst net.Conn, err error) {
	if err == io.EOF {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	l.abort(false)
}

// chunk is bytes read from the target, and when.
type chunk struct {
	b  []byte
	at time.Time
}

// pipeReplies is pipe for the target's side: a reader of its own stamps
// each read with the time, and the bytes are forwarded to the client in
// order, each once the reply delay has passed since it was read (so the
// delay is a latency, not a rate limit).
func (p *Proxy) pipeReplies(l *proxyLink, client, server net.Conn) {
	chunks := make(chan chunk, 64)
	var rerr error // written before chunks is closed
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32*1024)
			n, err := server.Read(buf)
			if n > 0 {
				chunks <- chunk{b: buf[:n], at: time.Now()}
			}
			if err != nil {
				rerr = err
				return
			}
		}
	}()
	for c := range chunks {
		if !p.holdReply(c.at) || !p.throttle(len(c.b)) {
			l.abort(false)
		} else if p.send(l, client, c.b) {
			continue
		}
		for range chunks { // the aborted link ends the reader
		}
		return
	}
	p.end(l, client, rerr)
}

// holdReply waits until the reply delay has passed since at, following
// changes of the delay; false when the proxy closes first.
func (p *Proxy) holdReply(at time.Time) bool {
	for {
		changed := p.delayChanged.Load()
		wait := time.Until(at.Add(time.Duration(p.replyDelay.Load())))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-*changed:
		case <-p.ctx.Done():
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// DelayReplies makes every byte the target sends reach the client d after
// the proxy read it (0 ends the delay, and bytes held go at once), on
// every connection, while the client's bytes pass as usual: a broker or a
// database whose answers come late, so that every wait for one stretches.
// Safe for concurrent use.
func (p *Proxy) DelayReplies(d time.Duration) {
	p.replyDelay.Store(int64(d))
	next := make(chan struct{})
	if old := p.delayChanged.Swap(&next); old != nil {
		close(*old)
	}
}

// LimitReplies makes every connection forward the target's bytes at no
// more than bytesPerSecond (0: no limit), while the client's bytes pass as
// usual: a slow link, on which a reply's time grows with its size. Safe
// for concurrent use; it applies from the next chunk read.
func (p *Proxy) LimitReplies(bytesPerSecond int64) { p.replyRate.Store(bytesPerSecond) }

// throttle waits as long as n bytes take at the reply rate; false when
// the proxy closes first.
func (p *Proxy) throttle(n int) bool {
	rate := p.replyRate.Load()
	if rate <= 0 {
		return true
	}
	t := time.NewTimer(time.Duration(int64(n) * int64(time.Second) / rate))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// Stall holds back every byte in both directions, on every connection,
// without closing anything: the peers see a network that stopped
// answering. Resume lets the held data through. Both are idempotent and
// safe for concurrent use.
func (p *Proxy) Stall() {
	g := make(chan struct{})
	p.stall.CompareAndSwap(nil, &g)
}

// Resume ends a Stall.
func (p *Proxy) Resume() {
	if g := p.stall.Swap(nil); g != nil {
		close(*g)
	}
}
