//go:build disruptive

// Tests in this file change the shared broker for everyone. They run alone
// (scripts/test runs them after everything else with -p 1, under the
// exclusive lock) and always restore it; scripts/test restores it again
// from WatermarkFile, since t.Cleanup does not run when go test -timeout
// fires.

package rabbitmq

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// watermarkFile holds the broker's vm_memory_high_watermark while a test
// has changed it, as rabbitmqctl's eval printed it (0.4, or
// {absolute,N}); scripts/test restores it from there.
const watermarkFile = "/tmp/ordo-rabbitmq-watermark"

func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// setWatermark sets vm_memory_high_watermark to what eval printed.
func setWatermark(t *testing.T, value string) {
	t.Helper()
	if strings.HasPrefix(value, "{absolute,") {
		rabbitmqctl(t, "set_vm_memory_high_watermark", "absolute", strings.TrimSuffix(strings.TrimPrefix(value, "{absolute,"), "}"))
		return
	}
	rabbitmqctl(t, "set_vm_memory_high_watermark", value)
}

// raiseMemoryAlarm sets a tiny memory watermark, so the broker raises its
// memory alarm and blocks every publishing connection, and returns a
// function that restores the value read before (also run at cleanup).
func raiseMemoryAlarm(t *testing.T) (restore func()) {
	t.Helper()
	orig := rabbitmqctl(t, "eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
	if err := os.WriteFile(watermarkFile, []byte(orig+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			setWatermark(t, orig)
			_ = os.Remove(watermarkFile)
			t.Logf("vm_memory_high_watermark restored to %s", orig)
		})
	}
	t.Cleanup(restore)
	rabbitmqctl(t, "set_vm_memory_high_watermark", "0.0000001")
	t.Logf("vm_memory_high_watermark was %s; set to 0.0000001", orig)
	return restore
}

// TestDisruptiveMemoryAlarm: the broker raises a real memory alarm under
// load and holds it for longer than 5 confirm timeouts. The publisher
// pauses (Connected false, Status says why), no confirm timeout runs out,
// no attempt is counted, nothing is parked, and everything is delivered
// once the alarm clears.
func TestDisruptiveMemoryAlarm(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run rabbitmqctl")
	}
	testkit.RequireRabbitMQ(t)
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	const confirmTimeout = 200 * time.Millisecond
	pub, err := New(Config{URL: testkit.AMQPURL(), Window: 64, ConfirmTimeout: confirmTimeout, StallTimeout: confirmTimeout,
		CallTimeout: time.Second, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	leases := relaytest.NewLeaseTable()
	own := leases.Ownership("n1", 0)
	leases.Grant("n1", 0)
	store := relaytest.NewStore(leases)
	cfg := relay.DefaultConfig()
	cfg.Node = "n1"
	cfg.RetryMin, cfg.RetryMax, cfg.PollInterval = 20*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	r, err := relay.New(cfg, store.ForNode("n1"), pub, own)
	if err != nil {
		t.Fatal(err)
	}
	pubCtx, stopPub := context.WithCancel(context.Background())
	relayCtx, stopRelay := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = pub.Run(pubCtx) }()
	go func() { defer wg.Done(); _ = r.Run(relayCtx) }()
	t.Cleanup(func() { stopRelay(); stopPub(); wg.Wait() })

	var idsMu sync.Mutex
	var ids []string
	insert := func(n int) {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%d", i%16)
		}
		// Written to partition 1, which the relay does not hold, then moved
		// to partition 0 with their exchange set: the relay never reads
		// one with the store's default exchange.
		for _, id := range store.Insert(1, keys...) {
			store.Update(id, func(row *relaytest.StoredRow) { row.Exchange, row.Partition = ex, 0 })
			checker.Expect(id.String())
			idsMu.Lock()
			ids = append(ids, id.String())
			idsMu.Unlock()
		}
	}
	insert(200)
	checker.WaitDistinct(t, 200, 30*time.Second)

	loadCtx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	load.Add(1)
	go func() {
		defer load.Done()
		for loadCtx.Err() == nil {
			insert(16)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { stopLoad(); load.Wait() }()

	restore := raiseMemoryAlarm(t)
	took := testkit.WaitFor(t, 30*time.Second, "the publisher sees connection.blocked", func() bool { return pub.Status().Blocked != "" })
	st := pub.Status()
	t.Logf("blocked %v after the alarm was raised: %q; Connected() = %v", took.Round(time.Millisecond), st.Blocked, pub.Connected())
	if pub.Connected() {
		t.Error("Connected() is true while the broker blocks publishing")
	}
	hold := 6 * confirmTimeout * 2
	time.Sleep(hold) // the condition under test is time passing while blocked
	if st := pub.Status(); st.Blocked == "" {
		t.Fatalf("the block ended by itself while the alarm was up: %+v", st)
	}
	restore()
	took = testkit.WaitFor(t, 30*time.Second, "the publisher sees connection.unblocked", func() bool { return pub.Status().Blocked == "" })
	t.Logf("unblocked %v after the watermark was restored (held %v)", took.Round(time.Millisecond), hold)
	stopLoad()
	load.Wait()

	idsMu.Lock()
	all := append([]string(nil), ids...)
	idsMu.Unlock()
	rep := checker.WaitDistinct(t, len(all), 60*time.Second)
	t.Logf("after the alarm: %s; relay %+v", rep, r.Stats())
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	why := map[string]int{}
	for _, id := range all {
		if row, ok := store.Get(uuid.MustParse(id)); ok && row.LastError != "" {
			why[row.LastError]++
		}
	}
	for e, n := range why {
		t.Logf("%d rows failed with: %s", n, e)
	}
	if s := r.Stats(); s.Failed != 0 || s.Parked != 0 {
		t.Fatalf("%d failed attempts and %d parked messages across the alarm; want none", s.Failed, s.Parked)
	}
}
