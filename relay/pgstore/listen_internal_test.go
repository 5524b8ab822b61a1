package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestListenReachesASlowServer: Listen's connect that ran out of time
// gives the next one twice as long, so a server slower to start a session
// than the first bound (a PostgreSQL just restarted on a loaded machine)
// is listened to after a few attempts instead of never. Here
// the first bound is 200 ms and every reply of the server comes 300 ms
// late.
func TestListenReachesASlowServer(t *testing.T) {
	testkit.RequirePostgres(t)
	proxy := testkit.NewProxy(t, testkit.HostPort(t, testkit.PostgresURL()))
	proxy.DelayReplies(300 * time.Millisecond)
	pool := testkit.NewPool(t, proxy.URL(testkit.PostgresURL()), 1)
	s := New(pool, "n1", testkit.Logger(t, 0))
	s.listenConnectMin = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Listen(ctx, func(int) {}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Listen: %v", err)
		}
	}()
	began := time.Now()
	testkit.WaitFor(t, 30*time.Second, "Listen connected", s.listening.Load)
	t.Logf("listening %v after the start", time.Since(began))
}

// TestWatchSlowsWhileTheSequenceIsStill: the sequence is looked at every
// base while commits come, and less often the longer it has been still,
// up to watchIdleTick; a base longer than that is kept.
func TestWatchSlowsWhileTheSequenceIsStill(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		still, base, want time.Duration
	}{
		{0, watchTick, watchTick},
		{50 * time.Millisecond, watchTick, watchTick},
		{100 * time.Millisecond, watchTick, 4 * time.Millisecond},
		{250 * time.Millisecond, watchTick, watchIdleTick},
		{time.Hour, watchTick, watchIdleTick},
		{time.Hour, 50 * time.Millisecond, 50 * time.Millisecond},
	} {
		w := watch{on: true, moved: now.Add(-tc.still)}
		if got := w.tick(now, tc.base); got != tc.want {
			t.Errorf("still for %v, base %v: tick %v, want %v", tc.still, tc.base, got, tc.want)
		}
	}
}
