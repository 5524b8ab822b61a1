package inbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestDatabaseOutageKeepsDeliveryInHand: while the consumer's database is
// cut (shorter than the lease), deliveries stay in hand and are retried in
// place: after the outage everything is handled once, in order, and no
// message was redelivered (a redelivery would count an attempt).
func TestDatabaseOutageKeepsDeliveryInHand(t *testing.T) {
	dbURL, direct := newDB(t)
	proxy := testkit.NewProxy(t, "127.0.0.1:5432")
	pool := testkit.NewPool(t, proxy.URL(dbURL), 6)
	cfg := consumerConfig(t, 2)
	cfg.LeaseTTL = 4 * time.Second
	r := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	waitFor(t, 30*time.Second, "shards owned", func() bool { return len(r.c.Owned()) == 2 })
	pub := newPublisher(t, cfg.Exchange)
	want := map[string]int64{}
	publish := func(seq int64) {
		for k := range 10 {
			key := fmt.Sprintf("k%d", k)
			pub.publish(key, seq)
			want[key] = seq
		}
	}
	publish(1)
	waitHandled(t, direct, want)
	proxy.Cut()
	publish(2)
	publish(3)
	time.Sleep(time.Second) // the outage: deliveries arrive and fail meanwhile
	proxy.Restore()
	waitHandled(t, direct, want)
	checkOnceInOrder(t, handledSeqs(t, direct), want)
	if st := r.c.Stats(); st.Retries != 0 || st.Handled != 30 {
		t.Fatalf("stats %+v: want 30 handled and no retries", st)
	}
}
