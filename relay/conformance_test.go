package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// The in-memory fakes pass the same conformance suites as the PostgreSQL
// and RabbitMQ backends (relay/pgstore, relay/rabbitmq), so the state
// machine tests on them say something about the real thing.

type memStore struct {
	table *relaytest.LeaseTable
	store *relaytest.Store
}

func (m *memStore) Store() relay.Store { return m.store.ForNode("n1") }
func (m *memStore) Insert(_ testing.TB, partition int, keys ...string) []uuid.UUID {
	return m.store.Insert(partition, keys...)
}
func (m *memStore) Grant(_ testing.TB, node string, partition int) int64 {
	m.table.Grant(node, partition)
	return m.table.Epoch(partition)
}
func (m *memStore) Skip(_ testing.TB, id uuid.UUID) {
	m.store.Update(id, func(r *relaytest.StoredRow) {
		r.Processed, r.ProcessedAt, r.Dead, r.Parked = true, time.Now(), true, false
	})
}
func (m *memStore) Retry(_ testing.TB, id uuid.UUID) {
	m.store.Update(id, func(r *relaytest.StoredRow) {
		r.Parked, r.Attempts, r.NextAttemptAt = false, 0, time.Time{}
	})
}
func (m *memStore) State(t testing.TB, id uuid.UUID) relaytest.RowState {
	r, ok := m.store.Get(id)
	if !ok {
		t.Fatalf("row %s not found", id)
	}
	return relaytest.RowState{Processed: r.Processed, Parked: r.Parked, Dead: r.Dead, Attempts: r.Attempts, LastError: r.LastError}
}

func TestMemStoreConformance(t *testing.T) {
	relaytest.StoreSuite(t, func(t *testing.T) relaytest.StoreHarness {
		table := relaytest.NewLeaseTable()
		return &memStore{table: table, store: relaytest.NewStore(table)}
	})
}

type memPublisher struct {
	pub  *relaytest.Publisher
	seen int // messages of Sent already returned by Received
}

func (m *memPublisher) Publisher() relay.Publisher { return m.pub }
func (m *memPublisher) Routable() relay.Message {
	return relay.Message{Exchange: "ex", RoutingKey: "bound", Type: "t", Payload: []byte(`{}`)}
}
func (m *memPublisher) Unroutable() relay.Message {
	return relay.Message{Exchange: "ex", RoutingKey: "unroutable", Type: "t", Payload: []byte(`{}`)}
}
func (m *memPublisher) Missing() relay.Message {
	return relay.Message{Exchange: "missing", RoutingKey: "bound", Type: "t", Payload: []byte(`{}`)}
}
func (m *memPublisher) Stall(testing.TB) { m.pub.Hold(true) }
func (m *memPublisher) Cut(testing.TB)   { m.pub.Close(true) }
func (m *memPublisher) Delay(testing.TB) { m.pub.Block() }
func (m *memPublisher) Restore(testing.TB) {
	m.pub.Unblock()
	m.pub.Hold(false)
	m.pub.Reconnect()
}
func (m *memPublisher) BeforeWrite(_ testing.TB, f func()) {
	if f == nil {
		m.pub.SetBeforeSend(nil)
		return
	}
	m.pub.SetBeforeSend(func(*relay.Message) { f() })
}
func (m *memPublisher) Received(testing.TB) []uuid.UUID {
	sent := m.pub.Sent()
	var ids []uuid.UUID
	for _, msg := range sent[m.seen:] {
		ids = append(ids, msg.ID)
	}
	m.seen = len(sent)
	return ids
}

func TestMemPublisherConformance(t *testing.T) {
	relaytest.PublisherSuite(t, func(t *testing.T) relaytest.PublisherHarness {
		pub := relaytest.NewPublisher()
		pub.SetFault(func(m *relay.Message) (relay.Result, bool) {
			switch {
			case m.Exchange == "missing":
				return relay.Result{Outcome: relay.Failed, Err: fmt.Errorf("%w: %q", relay.ErrExchangeNotFound, m.Exchange)}, true
			case m.RoutingKey == "unroutable":
				return relay.Result{Outcome: relay.Returned, Err: fmt.Errorf("returned by broker: 312 NO_ROUTE")}, true
			}
			return relay.Result{}, false
		})
		return &memPublisher{pub: pub}
	})
}
