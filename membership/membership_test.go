package membership

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/gossipfilter"
	"github.com/ordo-relay/ordo/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type running struct {
	m      *Membership
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	return startAfter(t, cfg, nil)
}

// startAfter starts a member, calling before (if not nil) between New
// and Run.
func startAfter(t *testing.T, cfg Config, before func(*Membership)) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testkit.Logger(t, slog.LevelWarn)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *running) stop() error {
	r.cancel()
	err, ok := <-r.done
	if ok {
		close(r.done)
	}
	return err
}

// waitAlive waits until r sees exactly want alive and returns how long
// that took.
func waitAlive(t *testing.T, r *running, want []string, timeout time.Duration) time.Duration {
	t.Helper()
	return testkit.WaitFor(t, timeout, fmt.Sprintf("%s sees %v alive", r.m.cfg.NodeName, want), func() bool {
		return slices.Equal(r.m.Alive(), want)
	})
}

func TestJoinLeave(t *testing.T) {
	addrs := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	var nodes []*running
	for i, name := range []string{"a", "b", "c"} {
		cfg := testConfig(name, addrs[i])
		cfg.Join = addrs[:1]
		nodes = append(nodes, start(t, cfg))
	}
	for _, n := range nodes {
		d := waitAlive(t, n, []string{"a", "b", "c"}, 30*time.Second)
		t.Logf("%s sees all three after %v", n.m.cfg.NodeName, d)
	}
	if err := nodes[2].stop(); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes[:2] {
		d := waitAlive(t, n, []string{"a", "b"}, 30*time.Second)
		t.Logf("%s sees c gone after %v (graceful leave)", n.m.cfg.NodeName, d)
	}
	ms := nodes[0].m.Members()
	if len(ms) != 3 || ms[2].Name != "c" || ms[2].State != "gone" {
		t.Fatalf("members after c left: %+v", ms)
	}
}

// TestSplitAndHeal: gossip between {a,b} and {c} is dropped; each side
// declares the other dead; after healing, the periodic rejoin merges them.
func TestSplitAndHeal(t *testing.T) {
	addrs := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	group := map[string]int{addrs[0]: 0, addrs[1]: 0, addrs[2]: 1}
	var split atomic.Bool
	var nodes []*running
	for i, name := range []string{"a", "b", "c"} {
		self := addrs[i]
		tr, err := gossipfilter.New(self, func(to string) bool { return !split.Load() || group[to] == group[self] })
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(name, self)
		cfg.Join = addrs // every node seeds every node
		cfg.RejoinInterval = time.Second
		cfg.Transport = tr
		nodes = append(nodes, start(t, cfg))
	}
	for _, n := range nodes {
		waitAlive(t, n, []string{"a", "b", "c"}, 30*time.Second)
	}
	split.Store(true)
	d := waitAlive(t, nodes[0], []string{"a", "b"}, 30*time.Second)
	t.Logf("a declares c dead %v after the split", d)
	waitAlive(t, nodes[2], []string{"c"}, 30*time.Second)
	split.Store(false)
	for _, n := range nodes {
		d := waitAlive(t, n, []string{"a", "b", "c"}, 30*time.Second)
		t.Logf("%s merged %v after healing", n.m.cfg.NodeName, d)
	}
}

func TestEncryption(t *testing.T) {
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	keys, err := ParseKeys(key)
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.FreeAddr(t)
	ca := testConfig("a", a)
	ca.Keys = keys
	na := start(t, ca)

	b := testkit.FreeAddr(t)
	cb := testConfig("b", b)
	cb.Keys = keys
	cb.Join = []string{a}
	nb := start(t, cb)
	waitAlive(t, na, []string{"a", "b"}, 30*time.Second)
	waitAlive(t, nb, []string{"a", "b"}, 30*time.Second)

	// Without the key: the join fails and the error says why.
	cc := testConfig("c", testkit.FreeAddr(t))
	cc.Join = []string{a}
	cc.JoinTimeout = 3 * time.Second
	cc.Logger = slog.New(slog.DiscardHandler)
	m, err := New(cc)
	if err != nil {
		t.Fatal(err)
	}
	var joinErr error
	var wg sync.WaitGroup
	wg.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go func() { defer wg.Done(); joinErr = m.Run(ctx) }()
	wg.Wait()
	if !errors.Is(joinErr, ErrJoin) || !strings.Contains(joinErr.Error(), "ORDO_GOSSIP_KEY") {
		t.Fatalf("join without the key: %v", joinErr)
	}
	if slices.Contains(na.m.Alive(), "c") {
		t.Fatal("a node without the key joined")
	}
}

func TestParseKeys(t *testing.T) {
	for _, bad := range []string{"notbase64!", base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := ParseKeys(bad); err == nil {
			t.Errorf("ParseKeys(%q) accepted", bad)
		}
	}
	k1 := base64.StdEncoding.EncodeToString(make([]byte, 32))
	k2 := base64.StdEncoding.EncodeToString(make([]byte, 16))
	keys, err := ParseKeys(k1 + ", " + k2)
	if err != nil || len(keys) != 2 || len(keys[0]) != 32 {
		t.Fatalf("ParseKeys: %v %v", keys, err)
	}
}

// TestKeyRotationWhileRunning: rotate a running two-node cluster from key
// A to key B without a restart; then a node with only B joins and a node
// with only A cannot.
func TestKeyRotationWhileRunning(t *testing.T) {
	keyA, keyB := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")
	a := testkit.FreeAddr(t)
	ca := testConfig("a", a)
	ca.Keys = [][]byte{keyA}
	na := start(t, ca)
	cb := testConfig("b", testkit.FreeAddr(t))
	cb.Keys, cb.Join = [][]byte{keyA}, []string{a}
	nb := start(t, cb)
	waitAlive(t, na, []string{"a", "b"}, 30*time.Second)

	for _, step := range []struct {
		action KeyAction
		key    []byte
	}{{KeyAdd, keyB}, {KeyUse, keyB}, {KeyRemove, keyA}} {
		for _, n := range []*running{na, nb} {
			if err := n.m.RotateKey(step.action, step.key); err != nil {
				t.Fatalf("%s %s: %v", n.m.cfg.NodeName, step.action, err)
			}
		}
	}
	if na.m.KeyCount() != 1 {
		t.Fatalf("a holds %d keys after the rotation", na.m.KeyCount())
	}
	if err := na.m.RotateKey(KeyRemove, keyB); err == nil {
		t.Fatal("removing the key in use was accepted")
	}

	cc := testConfig("c", testkit.FreeAddr(t))
	cc.Keys, cc.Join = [][]byte{keyB}, []string{a}
	start(t, cc)
	waitAlive(t, na, []string{"a", "b", "c"}, 30*time.Second)

	cd := testConfig("d", testkit.FreeAddr(t))
	cd.Keys, cd.Join, cd.JoinTimeout = [][]byte{keyA}, []string{a}, 3*time.Second
	cd.Logger = slog.New(slog.DiscardHandler)
	m, err := New(cd)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Run(ctx); !errors.Is(err, ErrJoin) {
		t.Fatalf("a node with the retired key joined: %v", err)
	}
	if slices.Contains(na.m.Alive(), "d") {
		t.Fatal("d is a member")
	}
}

func TestRotateKeyWithoutEncryption(t *testing.T) {
	n := start(t, testConfig("plain", testkit.FreeAddr(t)))
	if err := n.m.RotateKey(KeyAdd, []byte("aaaaaaaaaaaaaaaa")); !errors.Is(err, ErrNoEncryption) {
		t.Fatalf("err = %v", err)
	}
}

// testConfig is DefaultConfig for a node named name gossiping on bind.
func testConfig(name, bind string) Config {
	c := DefaultConfig()
	c.NodeName, c.BindAddr = name, bind
	return c
}
