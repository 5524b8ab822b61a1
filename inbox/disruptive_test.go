//go:build disruptive

// Tests in this file really stop and start the shared RabbitMQ. They run
// alone (scripts/test runs them after everything else with -p 1) and always
// bring the server back.

package inbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/inbox"
)

func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("rabbitmqctl %s took %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
}

// TestDisruptiveBrokerRestart: across a broker restart the consumer
// reconnects and handles everything once and in order, and the broker
// still routes each partition to the same shard (the headers bindings are
// durable; no ring to rebuild).
func TestDisruptiveBrokerRestart(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run rabbitmqctl")
	}
	_, pool := newDB(t)
	cfg := consumerConfig(t, 4)
	r := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	pub := newPublisher(t, cfg.Exchange)
	want := map[string]int64{}
	publish := func(p *publisher, from, to int64) {
		for s := from; s <= to; s++ {
			for k := range 16 {
				key := fmt.Sprintf("k%d", k)
				p.publish(key, s)
				want[key] = s
			}
		}
	}
	publish(pub, 1, 2)
	waitHandled(t, pool, want)

	restarted := false
	t.Cleanup(func() {
		if !restarted {
			rabbitmqctl(t, "start_app")
			rabbitmqctl(t, "await_startup")
		}
	})
	rabbitmqctl(t, "stop_app")
	rabbitmqctl(t, "start_app")
	restarted = true
	rabbitmqctl(t, "await_startup")

	publish(newPublisher(t, cfg.Exchange), 3, 4)
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	r.stop(t)
	checkRouting(t, inbox.TopologyOf(cfg), newPublisher(t, cfg.Exchange))
}
