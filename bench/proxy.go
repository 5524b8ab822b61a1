package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// proxyDialTimeout bounds the proxy's dial to its target.
const proxyDialTimeout = 5 * time.Second

// proxy is a TCP proxy on 127.0.0.1 in front of one server, to simulate an
// outage of that server for one client without touching the server:
// Cut resets every forwarded connection and refuses new ones (accepts and
// resets them at once, so clients fail fast), Restore forwards again.
// testkit has one for tests; this one needs no testing.TB.
//
// Its methods are safe for concurrent use. Close stops the listener,
// closes every connection and waits for all of the proxy's goroutines.
type proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close: aborts dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and one per forwarded connection

	mu     sync.Mutex
	links  map[*link]struct{}
	cut    bool
	gen    uint64 // bumped by every Cut: a link dialled across a Cut is dropped
	closed bool
}

// link is one forwarded connection.
type link struct {
	client, server net.Conn
	once           sync.Once
}

// close closes both sides once; with reset set it resets them (linger 0)
// so both peers see the connection fail, as when the network goes away.
func (l *link) close(reset bool) {
	l.once.Do(func() {
		closeConn(l.client, reset)
		closeConn(l.server, reset)
	})
}

func closeConn(c net.Conn, reset bool) {
	if tc, ok := c.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// newProxy listens on a free port of 127.0.0.1 and forwards to target.
func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: listen: %w", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the listening address, "127.0.0.1:port".
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// URL returns rawURL with its host replaced by the proxy's address.
func (p *proxy) URL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("proxy URL: %w", err)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// Cut resets every forwarded connection and, until Restore, every new one.
func (p *proxy) Cut() {
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		return
	}
	p.cut = true
	p.gen++
	links := p.takeLinksLocked()
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
}

// Restore forwards new connections again.
func (p *proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines. It is idempotent.
func (p *proxy) Close() {
	p.mu.Lock()
	p.closed = true
	links := p.takeLinksLocked()
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	for _, l := range links {
		l.close(false)
	}
	p.wg.Wait()
}

func (p *proxy) takeLinksLocked() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	clear(p.links)
	return links
}

func (p *proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A temporary failure (EMFILE and the like): back off briefly.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		if p.cut || p.closed {
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

// forward dials the target for client and copies both ways until either
// side ends or the link is closed.
func (p *proxy) forward(client net.Conn, gen uint64) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: proxyDialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		closeConn(client, true)
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.cut || p.closed || p.gen != gen {
		p.mu.Unlock()
		l.close(true)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(server, client)
		l.close(false)
	}()
	_, _ = io.Copy(client, server)
	l.close(false)
	<-done

	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}
