package rabbitmq

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// recordConn is a net.Conn that records each write, or fails them all.
type recordConn struct {
	net.Conn
	writes [][]byte
	fail   error
	closed bool
}

func (c *recordConn) Write(p []byte) (int, error) {
	if c.fail != nil {
		return 0, c.fail
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordConn) Close() error { c.closed = true; return nil }

// TestCorkConn: uncorked, every write goes out as it comes; corked, the
// writes are held, in order, and uncork sends them in one write; a held
// buffer that would pass corkMax goes out first; a failed write of what
// was held closes the connection and fails every later write.
func TestCorkConn(t *testing.T) {
	rc := &recordConn{}
	c := &corkConn{Conn: rc}
	write := func(s string) {
		t.Helper()
		if n, err := c.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
	}
	write("a")
	c.cork()
	write("b")
	write("c")
	if len(rc.writes) != 1 {
		t.Fatalf("%d writes sent while corked, want only the one before", len(rc.writes))
	}
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	if len(rc.writes) != 2 || string(rc.writes[1]) != "bc" {
		t.Fatalf("writes %q, want [a bc]", rc.writes)
	}

	c.cork()
	big := string(bytes.Repeat([]byte("x"), corkMax-1))
	write(big)
	write("yy") // past corkMax: what is held goes first
	if len(rc.writes) != 3 || string(rc.writes[2]) != big {
		t.Fatalf("%d writes, want the held %d bytes sent once the next would pass corkMax", len(rc.writes), len(big))
	}
	_ = c.uncork()
	if len(rc.writes) != 4 || string(rc.writes[3]) != "yy" {
		t.Fatalf("last write %q, want yy", rc.writes[len(rc.writes)-1])
	}

	c.cork()
	write("z")
	rc.fail = errors.New("broken pipe")
	if err := c.uncork(); err == nil || !rc.closed {
		t.Fatalf("a failed send of what was held: err %v, closed %v; want an error and the connection closed", err, rc.closed)
	}
	rc.fail = nil
	if _, err := c.Write([]byte("after")); err == nil {
		t.Fatal("a write after a failed send of what was held succeeded: the stream would resume mid-frame")
	}
}
