package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestClusterAdoptedTableKillNode: three nodes relay the article's table
// (-table-layout article), written by four producers that know nothing
// of Ordo (one row per transaction), and one node is killed with kill -9
// midway. Every row arrives, each key in the order its producer wrote
// it, with gap-free x-ordo-key-seq and prev, and every row's
// "ProcessedAt" is set.
func TestClusterAdoptedTableKillNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := testkit.Context(t, 3*time.Minute)
	if _, err := f.pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, f, 3, "ORDO_TABLE_LAYOUT=article", "ORDO_TABLE_EXCHANGE="+f.exchange)
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)

	const producers, keysPerProducer = 4, 10
	var mu sync.Mutex
	written := map[string][]string{}
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; lctx.Err() == nil; i++ {
				key := fmt.Sprintf("order-%d", p*keysPerProducer+i%keysPerProducer)
				id := uuid.Must(uuid.NewV7())
				// ctx, not lctx: a row committed as lctx ends must be known.
				if err := testkit.InsertArticleRow(ctx, f.pool, id, key, time.Now()); err != nil {
					t.Errorf("producer %d: %v", p, err)
					return
				}
				mu.Lock()
				written[key] = append(written[key], id.String())
				mu.Unlock()
				f.checker.Expect(id.String())
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	f.checker.WaitDistinct(t, 300, time.Minute)
	c.procs[2].Kill()
	c.waitConverged(t, []int{0, 1}, 30*time.Second)
	time.Sleep(500 * time.Millisecond) // keep the producers writing across the takeover
	stop()
	wg.Wait()
	rep := f.checker.WaitFor(t, time.Minute, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("after kill -9: %s", rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	got := map[string][]string{}
	for _, d := range f.checker.Deliveries() {
		if ids := got[d.CorrelationID]; !slices.Contains(ids, d.MessageID) {
			got[d.CorrelationID] = append(ids, d.MessageID)
		}
	}
	for key, ids := range written {
		if !slices.Equal(got[key], ids) {
			for _, p := range c.procs {
				for _, line := range strings.Split(p.Output(), "\n") {
					if strings.Contains(line, "later row") {
						t.Log(line)
					}
				}
			}
			i := 0
			for i < len(ids) && i < len(got[key]) && ids[i] == got[key][i] {
				i++
			}
			t.Fatalf("key %s delivered (first deliveries) out of the order written, from the %d-th of %d rows: delivered %v, written %v",
				key, i, len(ids), got[key][i:min(i+3, len(got[key]))], ids[i:min(i+3, len(ids))])
		}
	}
	fams := scrape(t, c.http[0])
	for name, typ := range tableTypes {
		if fam, ok := fams[name]; !ok || fam.GetType() != typ {
			t.Errorf("%s: exported %v, type %v, want %v", name, ok, fam.GetType(), typ)
		}
	}
	testkit.WaitFor(t, 30*time.Second, `every row's "ProcessedAt" set`, func() bool {
		var pending int
		err := f.pool.QueryRow(ctx, `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL`).Scan(&pending)
		return err == nil && pending == 0
	})
}
