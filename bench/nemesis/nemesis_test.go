package nemesis

import (
	"io"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/ordercheck"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

func TestPlanScheduleIsDeterministic(t *testing.T) {
	for _, profile := range []string{ProfileShort, ProfileLong} {
		a, err := planSchedule(42, profile, 3)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := planSchedule(42, profile, 3)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two plans of seed 42 differ:\n%v\n%v", profile, a, b)
		}
		c, _ := planSchedule(43, profile, 3)
		if reflect.DeepEqual(a, c) {
			t.Fatalf("%s: seeds 42 and 43 give the same plan", profile)
		}
	}
	if _, err := planSchedule(1, "medium", 3); err == nil {
		t.Fatal("an unknown profile was accepted")
	}
	if _, err := planSchedule(1, ProfileShort, 1); err == nil {
		t.Fatal("a plan for one node was accepted")
	}
}

func TestPlanScheduleShortRunsEveryKindOnce(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		plan, err := planSchedule(seed, ProfileShort, 3)
		if err != nil {
			t.Fatal(err)
		}
		kinds, total := checkShortPlan(t, seed, plan)
		want := slices.Clone(allKinds)
		slices.Sort(want)
		if !slices.Equal(kinds, want) {
			t.Fatalf("seed %d: kinds %v, want every kind once", seed, kinds)
		}
		if total < time.Minute || total > 2*time.Minute {
			t.Fatalf("seed %d: the short plan is estimated at %v, want 1-2 minutes of faults", seed, total)
		}
	}
}

func TestPlanScheduleLongLastsTenMinutes(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		plan, err := planSchedule(seed, ProfileLong, 3)
		if err != nil {
			t.Fatal(err)
		}
		var floor time.Duration
		count := map[Kind]int{}
		for i, s := range plan {
			floor += s.Hold + s.Quiet
			count[s.Kind]++
			checkStep(t, seed, i, s, holds(ProfileLong))
		}
		if floor < longMinimum || floor > longMinimum+time.Minute {
			t.Fatalf("seed %d: the long plan's holds and rests take %v, want at least %v (and not a minute more)", seed, floor, longMinimum)
		}
		for _, k := range allKinds {
			if count[k] < 2 {
				t.Fatalf("seed %d: kind %s runs %d times in the long plan, want at least 2", seed, k, count[k])
			}
		}
	}
}

// checkStep checks one planned step's fields.
func checkStep(t *testing.T, seed int64, i int, s plannedStep, hr map[Kind]holdRange) {
	t.Helper()
	if s.N != i+1 {
		t.Fatalf("seed %d: step %d is numbered %d", seed, i+1, s.N)
	}
	if r, ok := hr[s.Kind]; ok && (s.Hold < r.min.Round(100*time.Millisecond) || s.Hold > r.max) {
		t.Fatalf("seed %d: %s hold %v outside [%v, %v]", seed, s.Kind, s.Hold, r.min, r.max)
	}
	if s.Kind == kindPause && s.Hold <= nemesisTTL {
		t.Fatalf("seed %d: pause of %v is not longer than the lease (%v)", seed, s.Hold, nemesisTTL)
	}
	single := map[Kind]bool{kindKill: true, kindPause: true, kindGossipSplit: true, kindAMQPLink: true, kindPGLink: true}
	if single[s.Kind] && (s.Target < 0 || s.Target > 2) {
		t.Fatalf("seed %d: %s targets slot %d", seed, s.Kind, s.Target)
	}
	if (s.Kind == kindAMQPLink || s.Kind == kindPGLink) && s.Variant != variantCut && s.Variant != variantStall {
		t.Fatalf("seed %d: %s variant %q", seed, s.Kind, s.Variant)
	}
}

func TestParseKinds(t *testing.T) {
	got, err := ParseKinds("kill, poison")
	if err != nil || !slices.Equal(got, []Kind{kindKill, kindPoison}) {
		t.Fatalf("ParseKinds = %v, %v", got, err)
	}
	if all, err := ParseKinds("all"); all != nil || err != nil {
		t.Fatalf("all = %v", all)
	}
	if _, err := ParseKinds("kill,flood"); err == nil || !strings.Contains(err.Error(), "flood") {
		t.Fatalf("unknown kind: %v", err)
	}
	plan, _ := planSchedule(7, ProfileShort, 3)
	only := onlyKinds(plan, []Kind{kindPause, kindKill})
	if len(only) != 2 {
		t.Fatalf("onlyKinds kept %d steps, want 2", len(only))
	}
	for _, s := range only {
		if plan[s.N-1] != s {
			t.Fatalf("onlyKinds changed step %d", s.N)
		}
	}
}

func TestProbeKeysHashToTheirPartition(t *testing.T) {
	keys := probeKeys(64)
	for p, k := range keys {
		if got := partition.Of(k, 64); got != p {
			t.Fatalf("probe key %q hashes to %d, want %d", k, got, p)
		}
	}
}

// hist builds a history: each delivery d(...) arrives a millisecond after
// the one before it, from the source last named by in (default at first).
type hist struct {
	t0  time.Time
	src string
	ds  []delivery
}

// in makes the next deliveries name source.
func (h *hist) in(source string) *hist { h.src = source; return h }

func (h *hist) d(id, key string, keySeq, prev int64, partition int, epoch int64) *hist {
	if h.src == "" {
		h.src = "default"
	}
	h.ds = append(h.ds, delivery{Source: h.src, Delivery: testkit.Delivery{MessageID: id, CorrelationID: key, Type: "t", KeySeq: keySeq, PrevKeySeq: prev,
		HasPrevKeySeq: true, Partition: partition, Epoch: epoch, Received: h.t0.Add(time.Duration(len(h.ds)) * time.Millisecond)}})
	return h
}

// again delivers the i-th delivery again (redelivered or published again).
func (h *hist) again(i int, redelivered bool) *hist {
	d := h.ds[i]
	d.Redelivered = redelivered
	d.Received = h.t0.Add(time.Duration(len(h.ds)) * time.Millisecond)
	h.ds = append(h.ds, d)
	return h
}

func TestCheckHistory(t *testing.T) {
	t0 := time.Unix(1000, 0)
	h := func() *hist { return &hist{t0: t0} }
	promised := func(kt ...string) []promise {
		var ps []promise
		for _, k := range kt {
			ps = append(ps, promise{Source: "default", Key: k, Type: "t"})
		}
		return ps
	}
	one := []stepWindow{{Label: "all", Start: t0, End: t0.Add(time.Hour), Bound: 1}}
	tests := []struct {
		name     string
		h        *hist
		promises []promise
		skipped  []skip
		steps    []stepWindow
		want     historyVerdict // only the counts below are compared
	}{
		{"clean", h().d("a", "k", 1, 0, 0, 1).d("b", "k", 2, 1, 0, 1).d("c", "j", 1, 0, 1, 1), promised("k", "j"), nil, one,
			historyVerdict{Distinct: 3}},
		{"lost by key and type", h().d("a", "k", 1, 0, 0, 1), promised("k", "j"), nil, one,
			historyVerdict{Distinct: 1, Lost: 1}},
		{"lost by id", h().d("a", "k", 1, 0, 0, 1), []promise{{Source: "default", ID: "a"}, {Source: "default", ID: "z", Key: "k"}}, nil, one,
			historyVerdict{Distinct: 1, Lost: 1}},
		{"duplicate", h().d("a", "k", 1, 0, 0, 1).again(0, false), nil, nil, one,
			historyVerdict{Distinct: 1, Duplicates: 1}},
		{"redelivery is no duplicate", h().d("a", "k", 1, 0, 0, 1).again(0, true), nil, nil, one,
			historyVerdict{Distinct: 1, Redeliveries: 1}},
		{"reorder", h().d("b", "k", 2, 1, 0, 1).d("a", "k", 1, 0, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 2, Reorders: 1}},
		{"gap never delivered", h().d("a", "k", 1, 0, 0, 1).d("c", "k", 3, 2, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 2, Gaps: 1}},
		{"skipped on purpose", h().d("a", "k", 1, 0, 0, 1).d("c", "k", 3, 1, 0, 1), nil, []skip{{"default", ordercheck.Skip{Key: "k", KeySeq: 2}}}, one,
			historyVerdict{Distinct: 2}},
		{"a skip nobody made", h().d("a", "k", 1, 0, 0, 1).d("c", "k", 3, 1, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 2, Gaps: 2}},
		{"sent past a row later skipped (per-key limit 2)", h().d("a", "k", 1, 0, 0, 1).d("c", "k", 3, 2, 0, 1), nil, []skip{{"default", ordercheck.Skip{Key: "k", KeySeq: 2}}}, one,
			historyVerdict{Distinct: 2, Gaps: 1}},
		{"no prev header", h().d("a", "k", 1, 0, 0, 1).d("b", "k", 2, 1, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 2, Gaps: 1}},
		{"stale within bound", h().d("a", "k", 1, 0, 0, 1).d("b", "j", 1, 0, 0, 2).d("c", "i", 1, 0, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 3, Stale: 1}},
		{"stale over bound", h().d("a", "k", 1, 0, 0, 1).d("b", "j", 1, 0, 0, 2).d("c", "i", 1, 0, 0, 1).again(0, false), nil, nil, one,
			historyVerdict{Distinct: 3, Duplicates: 1, Stale: 2, OverBound: 1}},
		{"stale per partition", h().d("a", "k", 1, 0, 0, 5).d("b", "j", 1, 0, 1, 1), nil, nil, one,
			historyVerdict{Distinct: 2}},
		{"a redelivery is not stale", h().d("a", "k", 1, 0, 0, 1).d("b", "j", 1, 0, 0, 2).again(0, true), nil, nil, one,
			historyVerdict{Distinct: 2, Redeliveries: 1}},
		// Sources: key_seq, message ids and partitions count per source.
		{"one key in two sources", h().d("a", "k", 1, 0, 0, 1).in("billing").d("b", "k", 1, 0, 0, 1).d("c", "k", 2, 1, 0, 1).
			in("default").d("e", "k", 2, 1, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 4}},
		{"one key in two sources, each in order, interleaved", h().in("billing").d("b", "k", 1, 0, 0, 1).d("c", "k", 2, 1, 0, 1).
			in("default").d("a", "k", 1, 0, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 3}},
		{"a message under the other source's name", h().d("a", "k", 1, 0, 0, 1).in("billing").d("b", "k", 1, 0, 0, 1).
			in("default").d("c", "k", 2, 1, 0, 1), []promise{{Source: "billing", ID: "c"}}, nil, one,
			historyVerdict{Distinct: 3, Lost: 1}},
		{"the other source's rows under one name", h().d("a", "k", 1, 0, 0, 1).d("b", "k", 1, 0, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 2, Gaps: 1}},
		{"a promise per source", h().d("a", "k", 1, 0, 0, 1), []promise{{Source: "billing", Key: "k", Type: "t"}}, nil, one,
			historyVerdict{Distinct: 1, Lost: 1}},
		{"a skip in the other source", h().d("a", "k", 1, 0, 0, 1).d("c", "k", 3, 1, 0, 1), nil, []skip{{"billing", ordercheck.Skip{Key: "k", KeySeq: 2}}}, one,
			historyVerdict{Distinct: 2, Gaps: 2}},
		{"stale per source", h().d("a", "k", 1, 0, 0, 5).in("billing").d("b", "j", 1, 0, 0, 1), nil, nil, one,
			historyVerdict{Distinct: 2}},
		{"a source the run does not have", h().d("a", "k", 1, 0, 0, 1).in("ghost").d("b", "j", 1, 0, 1, 1), nil, nil, one,
			historyVerdict{Distinct: 2, Foreign: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no prev header" {
				tc.h.ds[1].HasPrevKeySeq = false
			}
			v := checkHistory(tc.h.ds, tc.promises, tc.skipped, tc.steps, []string{"default", "billing"})
			got := historyVerdict{Distinct: v.Distinct, Duplicates: v.Duplicates, Redeliveries: v.Redeliveries, Lost: v.Lost,
				Reorders: v.Reorders, Gaps: v.Gaps, Stale: v.Stale, OverBound: v.OverBound, Foreign: v.Foreign}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v\nproblems: %v", got, tc.want, v.Problems)
			}
			wantOK := tc.want.Lost == 0 && tc.want.Reorders == 0 && tc.want.Gaps == 0 && tc.want.OverBound == 0 && tc.want.Foreign == 0
			if v.OK() != wantOK {
				t.Fatalf("OK() = %v, want %v", v.OK(), wantOK)
			}
			if !wantOK && len(v.Problems) == 0 {
				t.Fatal("a failing history lists no problem")
			}
		})
	}
}

func TestCheckHistoryAttributesToSteps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	steps := []stepWindow{
		{Label: "warm-up", Start: t0, End: ms(10), Bound: 5},
		{Label: "step 1", Start: ms(10), End: ms(20), Quiet: ms(15), Bound: 0},
		{Label: "step 2", Start: ms(20), End: ms(1000), Bound: 1},
	}
	at := func(d testkit.Delivery, n int) delivery {
		d.Received = ms(n)
		return delivery{Source: "default", Delivery: d}
	}
	a := testkit.Delivery{MessageID: "a", CorrelationID: "k", KeySeq: 1, HasPrevKeySeq: true, Epoch: 1}
	b := testkit.Delivery{MessageID: "b", CorrelationID: "j", KeySeq: 1, HasPrevKeySeq: true, Epoch: 2}
	ds := []delivery{
		at(a, 1), at(a, 2), // a duplicate in the warm-up: quiet
		at(b, 11), at(a, 12), // a stale duplicate in step 1, before its quiet time: over its bound of 0
		at(a, 16), // a stale duplicate after step 1's quiet time: quiet
		at(a, 25), // stale in step 2: within its bound of 1
	}
	v := checkHistory(ds, nil, nil, steps, []string{"default"})
	if v.Duplicates != 4 || v.QuietDuplicates != 2 {
		t.Fatalf("duplicates %d (quiet %d), want 4 (quiet 2)", v.Duplicates, v.QuietDuplicates)
	}
	want := []stepTally{{Duplicates: 1}, {Stale: 2, Duplicates: 2, OverBound: true}, {Stale: 1, Duplicates: 1}}
	if !reflect.DeepEqual(v.Steps, want) || v.OverBound != 1 || v.Stale != 3 {
		t.Fatalf("steps %+v (stale %d, over bound %d), want %+v", v.Steps, v.Stale, v.OverBound, want)
	}
	if windowOf(steps, t0.Add(-time.Second)) != -1 || windowOf(steps, ms(1000)) != -1 || windowOf(steps, ms(20)) != 2 {
		t.Fatal("windowOf does not honour the windows' bounds")
	}
}

func TestRecoveryStats(t *testing.T) {
	s := func(n int) time.Duration { return time.Duration(n) * time.Second }
	byKind, p50, worst := recoveryStats([]stepResult{
		{kindKill, true, s(3)}, {kindKill, true, s(1)}, {kindKill, true, s(2)},
		{kindPause, true, s(5)}, {kindPause, false, 0},
		{kindPoison, false, 0},
		{kindSourceLink, true, s(4)},
	})
	want := []recoveryStat{
		{Kind: kindKill, N: 3, P50: s(2), Max: s(3)},
		{Kind: kindPause, N: 1, Failed: 1, P50: s(5), Max: s(5)},
		{Kind: kindPoison, Failed: 1},
		{Kind: kindSourceLink, N: 1, P50: s(4), Max: s(4)},
	}
	if !reflect.DeepEqual(byKind, want) {
		t.Fatalf("byKind = %+v\nwant %+v", byKind, want)
	}
	if p50 != s(3) || worst != s(5) {
		t.Fatalf("p50 %v max %v, want 3s 5s", p50, worst)
	}
}

func TestNemesisLine(t *testing.T) {
	v := historyVerdict{Lost: 1, Reorders: 2, Gaps: 3, OverBound: 4, Stale: 5, Duplicates: 6}
	v.Isolation = 7
	got := nemesisLine(ProfileShort, 2, 9, v, 1500*time.Millisecond, 4*time.Second)
	want := "RESULT scenario=nemesis profile=short sources=2 seed=9 lost=1 reorders=2 gaps=3 stale_over_bound=4 isolation_failures=7 stale_publishes=5 duplicates=6 recovery_p50_s=1.50 recovery_max_s=4.00"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestProcAddr(t *testing.T) {
	if got := procAddr("127.0.0.1:8080"); got != "0100007F:1F90" {
		t.Fatalf("procAddr = %q", got)
	}
	if got := procAddr("nonsense"); got != "" {
		t.Fatalf("procAddr(nonsense) = %q", got)
	}
}

func TestGossipAllowed(t *testing.T) {
	g := &gossipNet{isolated: -1}
	if !g.allowed(-1, 1) || !g.allowed(0, 1) {
		t.Fatal("without a split everything passes")
	}
	g.isolated = 0
	for _, tc := range []struct {
		from, to int
		want     bool
	}{{0, 1, false}, {1, 0, false}, {1, 2, true}, {2, 1, true}, {0, 0, true}, {-1, 1, false}, {-1, 0, false}} {
		if got := g.allowed(tc.from, tc.to); got != tc.want {
			t.Errorf("isolated 0: allowed(%d, %d) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestGossipProxy forwards UDP and TCP to a fake node and drops what a
// split forbids: packets by their source address, streams by the process
// that owns the connecting socket (this test's, for slot 0).
func TestGossipProxy(t *testing.T) {
	defer goleak.VerifyNone(t)
	// Slots: 0 and 2 are senders, 1 the fake node behind its proxy.
	senders := []*net.UDPConn{listenUDP(t), nil, listenUDP(t)}
	node, nodeTCP := listenUDPAndTCP(t)
	defer nodeTCP.Close()
	go func() { // the node echoes every stream
		for {
			c, err := nodeTCP.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	binds := []string{senders[0].LocalAddr().String(), node.LocalAddr().String(), senders[2].LocalAddr().String()}
	me := os.Getpid()
	g, err := newGossipNet(binds, func(slot int) int { return map[int]int{0: me}[slot] })
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	proxy := g.addrs()[1]
	send := func(from int, msg string) {
		t.Helper()
		to, _ := net.ResolveUDPAddr("udp", proxy)
		if _, err := senders[from].WriteToUDP([]byte(msg), to); err != nil {
			t.Fatal(err)
		}
	}
	// The node answers each packet at its source: the proxy's upstream
	// socket, which carries the answer back to the sender.
	recv := func(c *net.UDPConn) (string, *net.UDPAddr) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 100)
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n]), from
	}
	send(0, "ping-0")
	if msg, from := recv(node); msg != "ping-0" {
		t.Fatalf("the node got %q", msg)
	} else if _, err := node.WriteToUDP([]byte("ack-0"), from); err != nil {
		t.Fatal(err)
	}
	if msg, _ := recv(senders[0]); msg != "ack-0" {
		t.Fatalf("sender 0 got %q", msg)
	}
	echo := func() error {
		c, err := net.Dial("tcp", proxy)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err = io.ReadFull(c, make([]byte, 1))
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("a stream through the proxy: %v", err)
	}

	g.isolate(0)
	send(0, "dropped")
	send(2, "ping-2") // sent after the dropped one, on the same path
	if msg, _ := recv(node); msg != "ping-2" {
		t.Fatalf("during the split the node got %q, want only slot 2's packet", msg)
	}
	if err := echo(); err == nil {
		t.Fatal("a stream from slot 0's process passed the split")
	}
	if u := g.unknownStreams(); u != 0 {
		t.Fatalf("%d streams had an unknown sender; this process is slot 0", u)
	}

	g.heal()
	send(0, "ping-again")
	if msg, _ := recv(node); msg != "ping-again" {
		t.Fatalf("after the heal the node got %q", msg)
	}
	if err := echo(); err != nil {
		t.Fatalf("a stream after the heal: %v", err)
	}
	for _, c := range []*net.UDPConn{senders[0], senders[2], node} {
		_ = c.Close()
	}
}

// listenUDPAndTCP listens on one port number for both UDP and TCP, as a
// gossip node does. The UDP port is drawn by the kernel; another process
// may hold its TCP twin, so it draws again (a few times) when it does.
func listenUDPAndTCP(t *testing.T) (*net.UDPConn, net.Listener) {
	t.Helper()
	var err error
	for range 20 {
		u := listenUDP(t)
		var l net.Listener
		if l, err = net.Listen("tcp", u.LocalAddr().String()); err == nil {
			return u, l
		}
		_ = u.Close()
	}
	t.Fatalf("no port free for both UDP and TCP: %v", err)
	return nil, nil
}

func listenUDP(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPlanConsumersShortRunsEveryKindOnce(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		plan, err := planKinds(seed, ProfileShort, shippingInstances, consumerKinds)
		if err != nil {
			t.Fatal(err)
		}
		kinds, total := checkShortPlan(t, seed, plan)
		want := slices.Clone(consumerKinds)
		slices.Sort(want)
		if !slices.Equal(kinds, want) {
			t.Fatalf("seed %d: kinds %v, want every consumer kind once", seed, kinds)
		}
		if total > 90*time.Second {
			t.Fatalf("seed %d: the short consumer plan is estimated at %v, want at most 90 s of faults", seed, total)
		}
	}
}

// checkShortPlan checks every step of a short plan and returns its kinds,
// sorted, and its estimated length.
func checkShortPlan(t *testing.T, seed int64, plan []plannedStep) ([]Kind, time.Duration) {
	t.Helper()
	var kinds []Kind
	var total time.Duration
	for i, s := range plan {
		kinds = append(kinds, s.Kind)
		total += s.estimate()
		checkStep(t, seed, i, s, holds(ProfileShort))
	}
	slices.Sort(kinds)
	return kinds, total
}
