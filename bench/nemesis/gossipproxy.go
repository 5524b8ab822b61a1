package nemesis

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// gossipProxy forwards one node's gossip: UDP packets, through one
// upstream socket per sender (so an answer sent back to a packet's source
// finds its way), and TCP streams. close stops it and waits for its
// goroutines.
type gossipProxy struct {
	g      *gossipNet
	slot   int
	addr   string
	target *net.UDPAddr // the node's own gossip address (UDP and TCP)
	udp    *net.UDPConn
	tcp    net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	flows  map[string]*net.UDPConn // sender address -> upstream socket
	links  map[*gossipLink]struct{}
	closed bool
}

// gossipLink is one forwarded stream and the slot it came from (-1: not
// looked up, or unknown).
type gossipLink struct {
	from     int
	down, up net.Conn
	once     sync.Once
}

func (l *gossipLink) close() {
	l.once.Do(func() { _ = l.down.Close(); _ = l.up.Close() })
}

// startGossipProxy listens on one free port for both TCP and UDP and
// forwards to target.
func startGossipProxy(g *gossipNet, slot int, target string) (*gossipProxy, error) {
	t, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return nil, fmt.Errorf("gossip proxy: %w", err)
	}
	p := &gossipProxy{g: g, slot: slot, target: t, flows: map[string]*net.UDPConn{}, links: map[*gossipLink]struct{}{}}
	for try := 0; p.udp == nil; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("gossip proxy: %w", err)
		}
		ta := ln.Addr().(*net.TCPAddr)
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: ta.IP, Port: ta.Port})
		if err != nil {
			_ = ln.Close()
			if try < 10 {
				continue // the UDP port is taken: another port
			}
			return nil, fmt.Errorf("gossip proxy: %w", err)
		}
		p.tcp, p.udp, p.addr = ln, uc, ta.String()
	}
	p.wg.Add(2)
	go p.servePackets()
	go p.serveStreams()
	return p, nil
}

// servePackets forwards the packets sent to the proxy to the node.
func (p *gossipProxy) servePackets() {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, src, err := p.udp.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from := p.g.udpSender(src)
		if !p.g.allowed(from, p.slot) {
			continue
		}
		up, err := p.flow(src, from)
		if err != nil {
			continue
		}
		_, _ = up.Write(buf[:n])
	}
}

// flow returns the upstream socket for packets from src, opening it (and
// the goroutine that carries the node's answers back) the first time.
func (p *gossipProxy) flow(src *net.UDPAddr, from int) (*net.UDPConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up, ok := p.flows[src.String()]; ok {
		return up, nil
	}
	if p.closed {
		return nil, net.ErrClosed
	}
	up, err := net.DialUDP("udp", nil, p.target)
	if err != nil {
		return nil, err
	}
	p.flows[src.String()] = up
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := up.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil && p.g.allowed(p.slot, from) {
				_, _ = p.udp.WriteToUDP(buf[:n], src)
			}
		}
	}()
	return up, nil
}

// serveStreams forwards TCP streams to the node.
func (p *gossipProxy) serveStreams() {
	defer p.wg.Done()
	for {
		c, err := p.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from := -1
		if p.g.splitting() >= 0 {
			from = p.g.tcpSender(c.RemoteAddr(), c.LocalAddr())
		}
		if !p.g.allowed(from, p.slot) {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target.String())
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &gossipLink{from: from, down: c, up: up}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, l.up, l.down)
		go p.pipe(l, l.down, l.up)
	}
}

// pipe copies src to dst until either ends, then closes the link.
func (p *gossipProxy) pipe(l *gossipLink, dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// dropLinks closes the streams a split now forbids: on the isolated
// node's proxy all of them, elsewhere those from the isolated node or
// from an unknown sender.
func (p *gossipProxy) dropLinks() {
	p.mu.Lock()
	var drop []*gossipLink
	for l := range p.links {
		if !p.g.allowed(l.from, p.slot) {
			drop = append(drop, l)
		}
	}
	p.mu.Unlock()
	for _, l := range drop {
		l.close()
	}
}

// close stops the proxy and waits for its goroutines.
func (p *gossipProxy) close() {
	p.mu.Lock()
	p.closed = true
	links := make([]*gossipLink, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	for _, up := range p.flows {
		_ = up.Close()
	}
	p.mu.Unlock()
	_ = p.udp.Close()
	_ = p.tcp.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
}
