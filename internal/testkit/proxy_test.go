package testkit

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// startEchoServer runs a TCP echo server on 127.0.0.1 until t ends.
func startEchoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// echoOnce writes msg on c and reads it back, with a deadline.
func echoOnce(c net.Conn, msg string) error {
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

// requireDeadFast checks that reading c fails quickly with an error other
// than the deadline.
func requireDeadFast(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, _ = c.Write([]byte("x")) // may or may not fail, depending on timing
	_, err := c.Read(make([]byte, 1))
	if err == nil {
		t.Fatalf("%s: read succeeded, want an error", what)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read hung until the deadline, want a prompt error", what)
	}
}

func TestProxyEcho(t *testing.T) {
	p := NewProxy(t, startEchoServer(t))

	c1, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := echoOnce(c1, "hello through the proxy"); err != nil {
		t.Fatalf("echo before cut: %v", err)
	}

	p.Cut()
	p.Cut() // idempotent
	if got := p.Cuts(); got != 1 {
		t.Errorf("Cuts = %d, want 1", got)
	}
	requireDeadFast(t, c1, "established connection after Cut")

	c2, err := net.Dial("tcp", p.Addr())
	if err == nil { // accepted, then reset at once
		defer c2.Close()
		requireDeadFast(t, c2, "new connection while cut")
	}

	p.Restore()
	p.Restore() // idempotent
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := echoOnce(c3, "hello again"); err != nil {
		t.Fatalf("echo after restore: %v", err)
	}
}

func TestProxyHalfClose(t *testing.T) {
	p := NewProxy(t, startEchoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("all of it")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "all of it" {
		t.Fatalf("ReadAll after CloseWrite = %q, %v", got, err)
	}
}

func TestProxyConcurrentCutRestore(t *testing.T) {
	p := NewProxy(t, startEchoServer(t))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				if (i+j)%2 == 0 {
					p.Cut()
				} else {
					p.Restore()
				}
				if c, err := net.Dial("tcp", p.Addr()); err == nil {
					_ = echoOnce(c, "x") // either works or fails: no hang, no race
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	p.Restore()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c, "still works"); err != nil {
		t.Fatalf("echo after the storm: %v", err)
	}
}

func TestProxyURL(t *testing.T) {
	p := NewProxy(t, "127.0.0.1:1")
	for _, tc := range []struct{ name, in, want string }{
		{"postgres", "postgres://postgres@127.0.0.1:5432/db?sslmode=disable", "postgres://postgres@" + p.Addr() + "/db?sslmode=disable"},
		{"amqp", "amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:guest@" + p.Addr() + "/"},
		{"amqp vhost", "amqp://u:p@localhost/vh", "amqp://u:p@" + p.Addr() + "/vh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.URL(tc.in); got != tc.want {
				t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestProxyPostgres(t *testing.T) {
	RequirePostgres(t)
	p := NewProxy(t, HostPort(t, PostgresURL()))
	proxied := p.URL(PostgresURL())
	ctx := Context(t, 60*time.Second)

	conn, err := pgx.Connect(ctx, proxied)
	if err != nil {
		t.Fatalf("connect through proxy: %v", err)
	}
	defer conn.Close(context.Background())
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 through proxy = %d, %v", one, err)
	}

	p.Cut()
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err == nil {
		t.Fatal("query on a cut connection succeeded")
	} else {
		t.Logf("query after Cut: %v", err)
	}
	start := time.Now()
	if c, err := pgx.Connect(ctx, proxied); err == nil {
		c.Close(context.Background())
		t.Fatal("connect while cut succeeded")
	} else {
		t.Logf("connect while cut failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}

	p.Restore()
	conn2, err := pgx.Connect(ctx, proxied)
	if err != nil {
		t.Fatalf("connect after Restore: %v", err)
	}
	defer conn2.Close(context.Background())
	if err := conn2.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("query after Restore: %v", err)
	}
}

func TestProxyRabbitMQ(t *testing.T) {
	RequireRabbitMQ(t)
	p := NewProxy(t, HostPort(t, AMQPURL()))
	proxied := p.URL(AMQPURL())

	conn, err := amqp.Dial(proxied)
	if err != nil {
		t.Fatalf("connect through proxy: %v", err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel through proxy: %v", err)
	}
	if _, err := ch.QueueDeclare(UniqueName(t, "q"), false, true, true, false, nil); err != nil {
		t.Fatalf("declare through proxy: %v", err)
	}

	start := time.Now()
	p.Cut()
	select {
	case err := <-closed:
		t.Logf("NotifyClose after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if err == nil {
			t.Fatal("NotifyClose reported a clean close, want an error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no NotifyClose within 30s of Cut")
	}

	if c, err := amqp.Dial(proxied); err == nil {
		c.Close()
		t.Fatal("connect while cut succeeded")
	} else {
		t.Logf("connect while cut: %v", err)
	}

	p.Restore()
	conn2, err := amqp.Dial(proxied)
	if err != nil {
		t.Fatalf("connect after Restore: %v", err)
	}
	if err := conn2.Close(); err != nil {
		t.Fatalf("close after Restore: %v", err)
	}
}

// TestProxyStall: data sent while stalled is held, not lost, and arrives
// after Resume; the connection stays open.
func TestProxyStall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	p := NewProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Stall()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 4)
	if n, err := c.Read(buf); n != 0 || err == nil {
		t.Fatalf("read %q while stalled (err %v)", buf[:n], err)
	}
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after Resume: %q, %v", buf, err)
	}
}

// TestProxyDelayReplies: with replies delayed, the client's bytes reach
// the target at once while the target's answers come d later, as a
// latency (two answers sent together arrive together, not 2d apart); 0
// lets held answers through at once.
func TestProxyDelayReplies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 4) // what the target received, as it came
	srvDone := make(chan struct{})
	go func() {
		defer close(srvDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	p := NewProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Close(); <-srvDone }()
	if err := echoOnce(c, "warm"); err != nil {
		t.Fatal(err)
	}
	<-got

	const d = time.Second
	p.DelayReplies(d)
	start := time.Now()
	if _, err := c.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "a" {
			t.Fatalf("target got %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client's bytes did not reach the target")
	}
	if took := time.Since(start); took >= d {
		t.Fatalf("the client's bytes took %v: the delay is for replies only", took)
	}
	if _, err := c.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ab" {
		t.Fatalf("replies: %q, %v", buf, err)
	}
	took := time.Since(start)
	t.Logf("two replies after %v (delay %v)", took, d)
	if took < d || took >= 2*d {
		t.Fatalf("replies came after %v, want the delay %v once", took, d)
	}

	p.DelayReplies(time.Hour)
	if _, err := c.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	<-got
	p.DelayReplies(0)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf[:1]); err != nil || buf[0] != 'c' {
		t.Fatalf("after the delay ended: %q, %v", buf[:1], err)
	}
}

// TestProxyLimitReplies: with the reply rate limited, a big reply takes
// its size over the rate, and the client's bytes still pass at once.
func TestProxyLimitReplies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 256 << 10
	srvDone := make(chan struct{})
	go func() {
		defer close(srvDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		_, _ = c.Write(make([]byte, size))
	}()
	p := NewProxy(t, ln.Addr().String())
	p.LimitReplies(size) // a second for the reply
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Close(); <-srvDone }()
	start := time.Now()
	if _, err := c.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("%d bytes at %d a second took %v", size, size, took)
	if took < 900*time.Millisecond {
		t.Fatalf("%d bytes at %d bytes a second took %v, want about a second", size, size, took)
	}
}
