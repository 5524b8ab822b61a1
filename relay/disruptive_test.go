//go:build disruptive

// Tests in this file really stop and start the shared servers. They run
// alone (scripts/test runs them after everything else with -p 1) and always
// bring the server back.

package relay_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
)

func command(t *testing.T, timeout time.Duration, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	t.Logf("%s %s took %v", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
}

// durableQueue declares a durable queue bound to exchange, so messages
// survive a broker restart, and deletes it when t ends.
func durableQueue(t *testing.T, exchange, key string) string {
	t.Helper()
	name := testkit.UniqueName(t, "dq")
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(name, key, exchange, false, nil)
	})
	t.Cleanup(func() {
		testkit.WithChannel(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err })
	})
	return name
}

// drainQueue reads every message of queue into a recorder.
func drainQueue(t *testing.T, queue string) *testkit.Checker {
	t.Helper()
	rec := testkit.NewRecorder()
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				return err
			}
			rec.Record(testkit.DeliveryFromAMQP(d))
		}
	})
	return rec
}

func TestDisruptiveRabbitMQRestart(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run rabbitmqctl")
	}
	h := newHarness(t)
	q := durableQueue(t, h.exchange, "order.*")
	n := h.startNode(nodeOpts{})

	var wg sync.WaitGroup
	ctx, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			h.placeAndCancel(10)
		}
	}()
	h.waitRows(30*time.Second, "publishing under way", func(n int) bool { return n >= 200 }, "processed_at IS NOT NULL")

	restarted := false
	t.Cleanup(func() {
		if !restarted {
			command(t, 2*time.Minute, "rabbitmqctl", "start_app")
		}
	})
	command(t, 2*time.Minute, "rabbitmqctl", "stop_app")
	waitCond(t, 30*time.Second, "publisher notices the broker is gone", func() bool { return !n.pub.Connected() })
	pendingDuring := h.count("processed_at IS NULL")
	command(t, 2*time.Minute, "rabbitmqctl", "start_app")
	restarted = true
	back := time.Now()
	command(t, 2*time.Minute, "rabbitmqctl", "await_startup")
	waitCond(t, 60*time.Second, "publisher reconnected", n.pub.Connected)
	t.Logf("reconnected %v after start_app; %d rows were pending while the broker was down",
		time.Since(back).Round(time.Millisecond), pendingDuring)
	stopProducing()
	wg.Wait()
	h.waitRows(60*time.Second, "every row published and marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")

	rec := drainQueue(t, q)
	ctx2 := testkit.Context(t, 10*time.Second)
	rows, err := h.pool.Query(ctx2, `SELECT id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		rec.Expect(id)
	}
	rows.Close()
	rep := rec.Report()
	t.Logf("durable queue after the restart: %s", rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

func TestDisruptivePostgresRestart(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run pg_ctlcluster")
	}
	versions, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(versions) != 1 {
		t.Skipf("cannot find the one local PostgreSQL cluster: %v", err)
	}
	version := versions[0].Name()
	h := newHarness(t)
	h.startNode(nodeOpts{})
	h.placeAndCancel(100)
	h.checker.WaitDistinct(t, 200, 30*time.Second)

	command(t, 2*time.Minute, "pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart")
	// Producers retry until the database takes writes again.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := h.pool.Ping(testkit.Context(t, 5*time.Second)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("PostgreSQL did not come back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.placeAndCancel(100)
	rep := h.checker.WaitFor(t, 60*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() || rep.Distinct != 400 {
		t.Fatalf("checker: %s", rep.Detail())
	}
}
