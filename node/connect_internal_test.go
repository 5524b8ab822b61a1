package node

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestConnectWaitsLongerForASlowServer: a source's own connect (the
// leaser's, the health ping's) that ran out of time gives the next one
// twice as long, so a server slower to start a session than the first
// bound (a PostgreSQL just restarted on a loaded machine) is
// reached on the next attempt instead of never; a success starts the
// bound over. Here the first bound is 200 ms and every reply of the
// server comes 300 ms late.
func TestConnectWaitsLongerForASlowServer(t *testing.T) {
	testkit.RequirePostgres(t)
	proxy := testkit.NewProxy(t, testkit.HostPort(t, testkit.PostgresURL()))
	cc, err := pgx.ParseConfig(proxy.URL(testkit.PostgresURL()))
	if err != nil {
		t.Fatal(err)
	}
	s := &source{name: "default", leaseConn: cc, connectMin: 200 * time.Millisecond}
	proxy.DelayReplies(300 * time.Millisecond)
	ctx := testkit.Context(t, 30*time.Second)
	if c, err := s.connect(ctx); err == nil {
		c.Close(ctx)
		t.Fatal("the first connect, bounded by 200 ms, reached a server that answers 300 ms late")
	}
	// The next bounds are 400 ms, 800 ms, 1.6 s: room for a loaded machine.
	began := time.Now()
	var c *pgx.Conn
	for attempt := 2; c == nil; attempt++ {
		if c, err = s.connect(ctx); err != nil && attempt == 4 {
			t.Fatalf("connect %d, bounded by %v, failed: %v (after %v)", attempt, connectTimeout(attempt-1, s.connectMin), err, time.Since(began))
		}
	}
	c.Close(ctx)
	t.Logf("connected %v after the first connect gave up", time.Since(began))
	if n := s.slowConns.Load(); n != 0 {
		t.Fatalf("%d slow connects counted after a success (want 0)", n)
	}
	if got := connectTimeout(5, connectTimeoutMin); got != 8*connectTimeoutMin {
		t.Fatalf("bound after 5 slow connects: %v (want the cap, %v)", got, 8*connectTimeoutMin)
	}
}

// TestHealthPingReachesASlowServer: the health ping of a source whose
// server answers later than the ping period (h.every) still connects and
// pings, so the node does not call a slow database lost and hammer it with
// connects started over every period. Here the period is
// 100 ms and every reply comes 300 ms late.
func TestHealthPingReachesASlowServer(t *testing.T) {
	testkit.RequirePostgres(t)
	proxy := testkit.NewProxy(t, testkit.HostPort(t, testkit.PostgresURL()))
	cc, err := pgx.ParseConfig(proxy.URL(testkit.PostgresURL()))
	if err != nil {
		t.Fatal(err)
	}
	proxy.DelayReplies(300 * time.Millisecond)
	s := &source{name: "default", leaseConn: cc}
	h := &healthMonitor{every: 100 * time.Millisecond, dbWindow: 2 * time.Second}
	d := &dbPing{name: s.name, connect: s.connect}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.pingLoop(ctx, d)
	}()
	defer func() { cancel(); <-done }()
	began := time.Now()
	testkit.WaitFor(t, 30*time.Second, "a ping answered", func() bool { return d.lastPing.Load() != 0 })
	t.Logf("first ping answered %v after the start", time.Since(began))
}
