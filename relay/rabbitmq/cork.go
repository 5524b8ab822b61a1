package rabbitmq

import (
	"net"
	"sync"
)

// corkMax is the most a corked connection holds: a write that would take
// it past this sends what is held and itself at once, as the kernel's
// TCP_CORK sends full segments.
const corkMax = 64 << 10

// corkConn is the broker's TCP connection as the client library writes
// to it. While corked, its writes are kept in memory, in order, and
// uncork sends them in one write: the client library writes (and
// flushes) every publish on its own, and a round of the relay's
// publishes then costs one write system call, not one each. Whatever
// else the library writes meanwhile (a heartbeat, a channel's close)
// waits in line behind them. Safe for concurrent use; Publisher decides
// when to cork and uncork (publish.go), and never holds a write longer
// than corkHold.
type corkConn struct {
	net.Conn // the TCP connection

	mu     sync.Mutex
	corked bool
	held   []byte
	err    error // the failed write of what was held: every later write fails with it
}

// keepConn wraps dial so that the connection it makes is a corkConn,
// stored in *cc. amqp091-go calls it from DialConfig, in the caller's
// goroutine.
func keepConn(cc **corkConn, dial func(network, addr string) (net.Conn, error)) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		*cc = &corkConn{Conn: c}
		return *cc, nil
	}
}

// Write implements net.Conn: while corked it keeps p (sending what is
// held first once corkMax would be passed), otherwise it writes p.
func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		return c.Conn.Write(p)
	}
	if len(c.held)+len(p) > corkMax {
		if err := c.sendLocked(); err != nil {
			return 0, err
		}
		if len(p) > corkMax {
			return c.Conn.Write(p)
		}
	}
	c.held = append(c.held, p...)
	return len(p), nil
}

// cork starts holding writes.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork stops holding writes and sends what is held, in one write.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.sendLocked()
}

// sendLocked writes what is held. A failed write leaves the stream
// broken mid-frame: the connection is closed, which the client library's
// reader sees, and every later write fails.
func (c *corkConn) sendLocked() error {
	if c.err != nil || len(c.held) == 0 {
		return c.err
	}
	_, err := c.Conn.Write(c.held)
	if cap(c.held) > 2*corkMax {
		c.held = nil
	} else {
		c.held = c.held[:0]
	}
	if err != nil {
		c.err = err
		_ = c.Conn.Close()
	}
	return err
}
