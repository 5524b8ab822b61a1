package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// TestCloudEventsAccepted: the inbox handles one key's messages in order
// whichever form each comes in: an ordinary Ordo message, one the relay's
// publisher sent in CloudEvents mode, and a CloudEvent from another
// producer that carries the Ordo headers but neither message-id,
// correlation-id nor type (its cloudEvents:id, subject and type stand in).
func TestCloudEventsAccepted(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	var (
		mu  sync.Mutex
		got []string
	)
	record := recordHandler("a")
	startConsumer(t, cfg, "a", pool, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		mu.Lock()
		got = append(got, fmt.Sprintf("%s/%d %s %s", m.CorrelationID, m.KeySeq, m.ID, m.Type))
		mu.Unlock()
		return record(ctx, tx, m)
	})
	const key = "order-ce"
	part := int32(partition.Of(key, testPartitions))

	newPublisher(t, cfg.Exchange).publish(key, 1) // id order-ce-1, type t

	ce, err := rabbitmq.New(rabbitmq.Config{URL: testkit.AMQPURL(), CloudEvents: true, CloudEventsSource: "/test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ce.Run(ctx) }()
	defer func() { cancel(); <-done }()
	id2 := uuid.Must(uuid.NewV7())
	m2 := relay.Message{ID: id2, Partition: int(part), Epoch: 1, CorrelationID: key, KeySeq: 2, PrevKeySeq: 1,
		Exchange: cfg.Exchange, RoutingKey: "order.placed", Type: "ce.type", Payload: []byte(`{}`), OccurredAt: time.Now()}
	settled := make(chan relay.Result, 1)
	testkit.WaitFor(t, 30*time.Second, "the CloudEvents publish accepted", func() bool {
		return ce.Publish(ctx, &m2, func(r relay.Result) { settled <- r }) == nil
	})
	if r := <-settled; r.Outcome != relay.Confirmed {
		t.Fatalf("CloudEvents publish: %v (%v)", r.Outcome, r.Err)
	}

	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(context.Background(), cfg.Exchange, "order.placed", false, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
			Headers: amqp.Table{
				"cloudEvents:specversion": "1.0", "cloudEvents:id": "ce-3", "cloudEvents:source": "/elsewhere",
				"cloudEvents:type": "other.type", "cloudEvents:subject": key,
				"x-ordo-key-seq": int64(3), "x-ordo-prev-key-seq": int64(2), "x-ordo-partition": part,
			},
		})
	})
	waitHandled(t, pool, map[string]int64{key: 3})
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{key: 3})
	mu.Lock()
	defer mu.Unlock()
	want := []string{key + "/1 order-ce-1 t", fmt.Sprintf("%s/2 %s ce.type", key, id2), key + "/3 ce-3 other.type"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("handled\n%q\nwant\n%q", got, want)
	}
}

// TestCloudEventsKeysInParallel: CloudEvents without a correlation id,
// of two subjects, are handled in two lanes at once: the handler of the
// first waits until the second's has started.
func TestCloudEventsKeysInParallel(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 2
	started := map[string]chan struct{}{"ce-a": make(chan struct{}), "ce-b": make(chan struct{})}
	var once sync.Map
	record := recordHandler("a")
	startConsumer(t, cfg, "a", pool, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if _, loaded := once.LoadOrStore(m.CorrelationID, true); !loaded {
			close(started[m.CorrelationID])
		}
		other := "ce-b"
		if m.CorrelationID == "ce-b" {
			other = "ce-a"
		}
		select {
		case <-started[other]:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s: the other subject's handler did not start: one lane for both", m.CorrelationID)
		}
		return record(ctx, tx, m)
	})
	for _, key := range []string{"ce-a", "ce-b"} {
		testkit.WithChannel(t, func(ch *amqp.Channel) error {
			return ch.PublishWithContext(context.Background(), cfg.Exchange, "order.placed", false, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
				Headers: amqp.Table{
					"cloudEvents:specversion": "1.0", "cloudEvents:id": key + "-1", "cloudEvents:source": "/elsewhere",
					"cloudEvents:type": "t", "cloudEvents:subject": key,
					"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(partition.Of(key, testPartitions)),
				},
			})
		})
	}
	waitHandled(t, pool, map[string]int64{"ce-a": 1, "ce-b": 1})
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"ce-a": 1, "ce-b": 1})
	var stored int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ordo_inbox_messages`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("stored %d (%v), want none: each handled at its first run", stored, err)
	}
}
