package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/gossipfilter"
	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// publishLog records every publish: who sent what under which epoch, when.
type publishLog struct {
	mu   sync.Mutex
	recs []publishRec
}

type publishRec struct {
	node      string
	partition int
	epoch     int64
	at        time.Time
}

type recordingPublisher struct {
	relay.Publisher
	node string
	log  *publishLog
}

func (p *recordingPublisher) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	p.log.mu.Lock()
	p.log.recs = append(p.log.recs, publishRec{p.node, m.Partition, m.Epoch, time.Now()})
	p.log.mu.Unlock()
	return p.Publisher.Publish(ctx, m, settle)
}

// TestSplitBrain: gossip between {n1, n2} and {n3} is dropped while all
// three reach PostgreSQL. Leases never overlap (no publish under an epoch
// after a newer epoch of its partition was claimed), per-key order holds,
// and the views merge after healing.
func TestSplitBrain(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 16
	ob := testkit.NewOutbox(t, partitions, 3)
	dbURL, pool, prod := ob.URL, ob.Pool, ob.Producer
	ctx := testkit.Context(t, 2*time.Minute)
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)

	names := []string{"n1", "n2", "n3"}
	gossip := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	group := map[string]int{gossip[0]: 0, gossip[1]: 0, gossip[2]: 1}
	var split atomic.Bool
	plog := &publishLog{}
	httpAddrs := make([]string, 3)
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(context.Background())
	defer func() { stop(); wg.Wait() }()
	for i, name := range names {
		self := gossip[i]
		tr, err := gossipfilter.New(self, func(to string) bool { return !split.Load() || group[to] == group[self] })
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), name
		cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", partitions, 3
		cfg.Gossip.BindAddr, cfg.Gossip.Join, cfg.Gossip.RejoinInterval = self, gossip, time.Second
		cfg.Gossip.Keys = [][]byte{[]byte("0123456789abcdef")}
		cfg.Relay.PollInterval = 200 * time.Millisecond
		ready := make(chan string, 1)
		opts := node.Options{
			Logger: testkit.Logger(t, slog.LevelWarn).With("node", name),
			Ready:  func(a string) { ready <- a },
		}
		hooked := nodehook.With(runCtx, nodehook.Hooks{
			GossipTransport: tr,
			WrapPublisher:   func(p relay.Publisher) relay.Publisher { return &recordingPublisher{p, name, plog} },
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := node.Run(hooked, cfg, opts); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
		select {
		case httpAddrs[i] = <-ready:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not start", name)
		}
	}
	views := func() [][]string {
		out := make([][]string, 3)
		for i, a := range httpAddrs {
			var st node.Status
			resp, err := http.Get("http://" + a + "/status")
			if err != nil {
				continue
			}
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			out[i] = st.Assignment
		}
		return out
	}
	owners := func(a []string) int {
		s := map[string]bool{}
		for _, o := range a {
			s[o] = true
		}
		return len(s)
	}
	testkit.WaitFor(t, 30*time.Second, "all three agree on a three-way map", func() bool {
		v := views()
		return owners(v[0]) == 3 && slices.Equal(v[0], v[1]) && slices.Equal(v[0], v[2])
	})

	// Load: pairs of messages per key, all the while.
	var produced atomic.Int64
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var lw sync.WaitGroup
	lw.Add(1)
	go func() {
		defer lw.Done()
		for loadCtx.Err() == nil {
			key := uuid.NewString()
			for i := range 2 {
				var ids []uuid.UUID
				err := pgx.BeginFunc(loadCtx, pool, func(tx pgx.Tx) error {
					var err error
					ids, err = prod.Enqueue(loadCtx, tx, outbox.Message{CorrelationID: key, Exchange: ex,
						RoutingKey: fmt.Sprintf("m.%d", i), Type: "t", Payload: json.RawMessage(`{}`)})
					return err
				})
				if err != nil {
					return // stopped: that transaction did not commit
				}
				checker.Expect(ids[0].String()) // only once committed
				produced.Add(1)
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()
	defer func() { stopLoad(); lw.Wait() }()

	split.Store(true)
	splitAt := time.Now()
	testkit.WaitFor(t, 30*time.Second, "both sides see the split", func() bool {
		v := views()
		return owners(v[0]) == 2 && owners(v[2]) == 1
	})
	t.Logf("views diverged %v after the split", time.Since(splitAt).Round(time.Millisecond))
	// Hold the split across several lease TTLs under load.
	for time.Since(splitAt) < 6*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	split.Store(false)
	healed := time.Now()
	testkit.WaitFor(t, 30*time.Second, "views merged after healing", func() bool {
		v := views()
		return owners(v[0]) == 3 && slices.Equal(v[0], v[1]) && slices.Equal(v[0], v[2])
	})
	t.Logf("views merged %v after healing", time.Since(healed).Round(time.Millisecond))
	stopLoad()
	lw.Wait()
	rep := checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("split brain with %d messages: %s", produced.Load(), rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}

	// No publish under an epoch once a newer epoch of its partition was
	// claimed: the fence held.
	type claim struct {
		epoch int64
		at    time.Time
	}
	rows, err := pool.Query(ctx, `SELECT partition, epoch, at FROM ordo_lease_audit WHERE event = 'claim' ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	claims := map[int][]claim{}
	var nClaims int
	for rows.Next() {
		var p int
		var c claim
		if err := rows.Scan(&p, &c.epoch, &c.at); err != nil {
			t.Fatal(err)
		}
		claims[p] = append(claims[p], c)
		nClaims++
	}
	rows.Close()
	plog.mu.Lock()
	recs := slices.Clone(plog.recs)
	plog.mu.Unlock()
	sort.Slice(recs, func(i, j int) bool { return recs[i].at.Before(recs[j].at) })
	for _, r := range recs {
		for _, c := range claims[r.partition] {
			if c.epoch > r.epoch && r.at.After(c.at) {
				t.Fatalf("%s published on partition %d under epoch %d at %v, after epoch %d was claimed at %v",
					r.node, r.partition, r.epoch, r.at, c.epoch, c.at)
			}
		}
	}
	t.Logf("%d publishes checked against %d claims: no overlap", len(recs), nClaims)
}
