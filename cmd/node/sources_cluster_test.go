package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/wire"
)

// TestClusterTwoSourcesKill9: three node processes relay two outbox
// databases (ORDO_SOURCES) under load on both. One node's link to billing
// is cut, then restored; then a node is killed with SIGKILL. Each
// source's messages go to an exchange of their own, checked for per-key
// order and loss on their own: per (source, key), nothing lost.
func TestClusterTwoSourcesKill9(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 12
	sources := []string{wire.DefaultSource, "billing"}
	dbs, exchanges, checkers := map[string]*testkit.Outbox{}, map[string]string{}, map[string]*testkit.Checker{}
	for _, s := range sources {
		dbs[s], exchanges[s] = testkit.NewOutbox(t, partitions, 3), testkit.NewExchange(t)
		checkers[s] = testkit.NewChecker(t, testkit.AMQPURL(), exchanges[s], "#")
	}
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	c := &cluster{f: &fixture{bin: bin}, extra: []string{"ORDO_LEASE_TTL=5s", "ORDO_PARTITIONS=" + fmt.Sprint(partitions)}}
	links := make([]*testkit.Proxy, 3) // each node's own link to billing
	for i := range 3 {
		links[i] = testkit.NewProxy(t, testkit.HostPort(t, dbs["billing"].URL))
		c.names = append(c.names, fmt.Sprintf("n%d", i+1))
		c.gossip, c.http = append(c.gossip, testkit.FreeAddr(t)), append(c.http, testkit.FreeAddr(t))
	}
	c.procs = make([]*testkit.Process, 3)
	for i := range 3 {
		c.sourcesEnv = append(c.sourcesEnv, "ORDO_SOURCES=default="+dbs[wire.DefaultSource].URL+" billing="+links[i].URL(dbs["billing"].URL))
	}
	for i := range 3 {
		c.start(t, i)
	}
	held := func(source string, idx ...int) int {
		n := 0
		for _, i := range idx {
			st, _ := c.status(t, i)
			for _, s := range st.Sources {
				if s.Name == source {
					n += len(s.Held)
				}
			}
		}
		return n
	}
	testkit.WaitFor(t, 60*time.Second, "both sources spread over the three nodes", func() bool {
		for i := range 3 {
			if held(wire.DefaultSource, i) != partitions/3 || held("billing", i) != partitions/3 {
				return false
			}
		}
		return true
	})

	ctx, stopLoad := context.WithCancel(context.Background())
	done := make(chan struct{})
	produced := map[string]int{} // the load's until done is closed
	go func() {
		defer close(done)
		n := produced
		for i := 0; ctx.Err() == nil; i++ {
			for _, s := range sources {
				var ids []string
				err := pgx.BeginFunc(ctx, dbs[s].Pool, func(tx pgx.Tx) error {
					got, err := dbs[s].Producer.Enqueue(ctx, tx, outbox.Message{CorrelationID: fmt.Sprintf("k%d", i%40),
						Exchange: exchanges[s], RoutingKey: "m", Type: "t", Payload: json.RawMessage(`{}`)})
					for _, id := range got {
						ids = append(ids, id.String())
					}
					return err
				})
				if err == nil {
					checkers[s].Expect(ids...)
					n[s]++
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { stopLoad(); <-done }()

	links[2].Cut()
	testkit.WaitFor(t, 60*time.Second, "n1 and n2 hold every billing partition while n3 is cut off from billing", func() bool {
		return held("billing", 0, 1) == partitions && held(wire.DefaultSource, 2) == partitions/3
	})
	links[2].Restore()
	testkit.WaitFor(t, 60*time.Second, "n3 takes its billing share back", func() bool { return held("billing", 2) == partitions/3 })

	c.procs[1].Kill()
	select {
	case <-c.procs[1].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("n2 still runs 10 s after SIGKILL")
	}
	testkit.WaitFor(t, 60*time.Second, "n1 and n3 hold every partition of both sources after n2's SIGKILL", func() bool {
		return held(wire.DefaultSource, 0, 2) == partitions && held("billing", 0, 2) == partitions
	})
	stopLoad()
	<-done
	for _, s := range sources {
		rep := checkers[s].WaitFor(t, 60*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
		t.Logf("source %s, %d messages: %s", s, produced[s], rep)
		if !rep.OK() {
			t.Fatalf("source %s: %s", s, rep.Detail())
		}
	}
}
