package main

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of four is the second", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 0.99, 99 * time.Millisecond},
		{"p100 is the max", ms(1, 2, 3), 1, 3 * time.Millisecond},
		{"p0 is the min", ms(1, 2, 3), 0, 1 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.sorted, tc.q); got != tc.want {
				t.Fatalf("percentile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestResultLine(t *testing.T) {
	r := newResult("drain")
	r.Param("nodes", 1)
	r.Param("outage", 10*time.Second)
	r.Figure("msgs_per_sec", 8130.123456789, "msg/s")
	r.Check = Check{Total: 3, Distinct: 3}
	want := "RESULT scenario=drain nodes=1 outage=10s msgs_per_sec=8130.12 total=3 distinct=3 duplicates=0 lost=0 reorders=0 gaps=0"
	if got := r.Line(); got != want {
		t.Fatalf("Line() =\n%s\nwant\n%s", got, want)
	}
	var b strings.Builder
	r.Check.Lost, r.Check.Reorders = 2, 1
	r.Print(&b)
	for _, loud := range []string{"!!! LOST 2", "!!! REORDERED 1"} {
		if !strings.Contains(b.String(), loud) {
			t.Errorf("Print does not say %q:\n%s", loud, b.String())
		}
	}
}

// echoServer echoes lines until closed; it returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup // the accept loop and one per connection
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				_ = c.Close()
				return
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestProxyCutAndRestore(t *testing.T) {
	p, err := newProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "before"); err != nil || got != "before" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	p.Cut()
	if _, err := roundTrip(c, "during"); err == nil {
		t.Fatal("a connection survived Cut")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		if _, err := roundTrip(c2, "new"); err == nil {
			t.Fatal("a new connection got through while cut")
		}
		c2.Close()
	}

	p.Restore()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, "after"); err != nil || got != "after" {
		t.Fatalf("after Restore: %q, %v", got, err)
	}
	p.Close()
	p.Close() // idempotent
}

func TestProxyURL(t *testing.T) {
	p, err := newProxy("127.0.0.1:5672")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, err := p.URL("amqp://guest:guest@127.0.0.1:5672/vh?heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	if want := "amqp://guest:guest@" + p.Addr() + "/vh?heartbeat=5"; got != want {
		t.Fatalf("URL = %q, want %q", got, want)
	}
}

func TestParseOptions(t *testing.T) {
	env := map[string]string{"ORDO_BENCH_ROWS": "500", "ORDO_BENCH_RATE": "200"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	o, names, err := parseOptions([]string{"-rate", "300", "drain", "latency"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Rows != 500 || o.Rate != 300 || strings.Join(names, ",") != "drain,latency" {
		t.Fatalf("rows=%d rate=%d names=%v; want 500 (env), 300 (flag beats env), drain,latency", o.Rows, o.Rate, names)
	}
	if o.keysOr(10000) != 10000 || o.rateOr(1000) != 300 {
		t.Fatal("scenario defaults")
	}
	if _, _, err := parseOptions([]string{"nosuch"}, lookup, io.Discard); err == nil {
		t.Fatal("unknown scenario accepted")
	}
	if _, names, err := parseOptions([]string{"all"}, lookup, io.Discard); err != nil || len(names) != len(scenarios) {
		t.Fatalf("all = %v, %v", names, err)
	}
}

func TestMeasureOutage(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	cut, restore := at(3), at(13)
	// id: commit time, receive time
	msgs := map[string][2]float64{
		"steady":    {2.0, 2.004},   // before the cut, delivered before it
		"warmup":    {0.5, 0.51},    // in the first second: not steady state
		"caught":    {2.99, 13.4},   // in flight at the cut: backlog, not steady
		"routed":    {2.995, 3.001}, // routed before the link died
		"outage1":   {5, 14.5},
		"outage2":   {12, 15.0},
		"afterward": {13.5, 13.2 + 0.4},
	}
	var ids []string
	commits := map[string]commitTimes{}
	recv := map[string]time.Time{}
	for id, v := range msgs {
		ids = append(ids, id)
		commits[id] = commitTimes{committed: at(v[0])}
		recv[id] = at(v[1])
	}
	m := measureOutage(ids, commits, recv, cut, restore, 3*time.Second)
	if m.duringOutage != 2 || m.backlog != 3 || m.deliveredDuringOutage != 1 {
		t.Errorf("during=%d backlog=%d deliveredDuring=%d; want 2 3 1", m.duringOutage, m.backlog, m.deliveredDuringOutage)
	}
	if !m.firstOutageMsg.Equal(at(14.5)) || !m.drainedAt.Equal(at(15)) || !m.firstAfterRestore.Equal(at(13.4)) {
		t.Errorf("firstOutage=%v drained=%v firstAfter=%v", m.firstOutageMsg.Sub(t0), m.drainedAt.Sub(t0), m.firstAfterRestore.Sub(t0))
	}
	if len(m.steady) != 1 || m.steady[0] != 4*time.Millisecond {
		t.Errorf("steady = %v, want [4ms]", m.steady)
	}
}
