package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// MappingMod is the only partition -> shard mapping: shard =
// x-ordo-partition mod S. Stored with the topology so that a future
// mapping cannot be mixed up with it.
const MappingMod = "mod"

// Topology is a consumer group's broker layout, derived from its Config:
//
//	source exchange (topic) --Bindings--> <Name>.shards (headers, alternate-exchange <Name>.unroutable)
//	<Name>.shards --x-ordo-partition = p--> <Name>.shard.<p mod S>    (one binding per partition, x-match all-with-x)
//	<Name>.unroutable (fanout) --> <Name>.dead                          (no x-ordo-partition, or p >= P)
//
// The headers exchange needs no plugin, keeps no state outside its
// bindings, and routes the same after a broker restart; a partition's
// shard changes only when S does.
type Topology struct {
	Name       string
	Exchange   string
	Bindings   []string
	Shards     int
	Partitions int
}

// TopologyOf returns the topology cfg describes.
func TopologyOf(cfg Config) Topology {
	b := slices.Clone(cfg.Bindings)
	slices.Sort(b)
	return Topology{Name: cfg.Name, Exchange: cfg.Exchange, Bindings: slices.Compact(b), Shards: cfg.Shards, Partitions: cfg.Partitions}
}

// ShardQueue names shard i's queue.
func (t Topology) ShardQueue(i int) string { return t.Name + ".shard." + strconv.Itoa(i) }

// ShardsExchange names the headers exchange that routes partitions to
// shards.
func (t Topology) ShardsExchange() string { return t.Name + ".shards" }

// UnroutableExchange names the alternate exchange of ShardsExchange.
func (t Topology) UnroutableExchange() string { return t.Name + ".unroutable" }

// DeadQueue names the dead-letter queue.
func (t Topology) DeadQueue() string { return t.Name + ".dead" }

// ShardOf returns the shard of partition p: p mod S.
func (t Topology) ShardOf(p int) int { return p % t.Shards }

// Declare declares t on ch: idempotent, and safe while other instances do
// the same. The source exchange is declared as a durable topic exchange
// (as Ordo's producers expect it) so that binding works before the first
// publish.
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(t.Exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare source exchange %s: %w", t.Exchange, err)
	}
	if err := ch.ExchangeDeclare(t.UnroutableExchange(), "fanout", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s: %w", t.UnroutableExchange(), err)
	}
	if err := ch.ExchangeDeclare(t.ShardsExchange(), "headers", true, false, false, false,
		amqp.Table{"alternate-exchange": t.UnroutableExchange()}); err != nil {
		return fmt.Errorf("declare %s: %w", t.ShardsExchange(), err)
	}
	if _, err := ch.QueueDeclare(t.DeadQueue(), true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s: %w", t.DeadQueue(), err)
	}
	if err := ch.QueueBind(t.DeadQueue(), "", t.UnroutableExchange(), false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", t.DeadQueue(), err)
	}
	for i := range t.Shards {
		if _, err := ch.QueueDeclare(t.ShardQueue(i), true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare %s: %w", t.ShardQueue(i), err)
		}
	}
	for p := range t.Partitions {
		// "all-with-x", not "all": a headers exchange ignores binding
		// arguments whose names start with "x-" unless told otherwise
		// (RabbitMQ 3.10 and later), and would route every message to
		// every shard.
		args := amqp.Table{"x-match": "all-with-x", wire.HeaderPartition: int32(p)}
		if err := ch.QueueBind(t.ShardQueue(t.ShardOf(p)), "", t.ShardsExchange(), false, args); err != nil {
			return fmt.Errorf("bind partition %d: %w", p, err)
		}
	}
	// The source binding last: nothing reaches the shards exchange before
	// every partition has its queue.
	for _, key := range t.Bindings {
		if err := ch.ExchangeBind(t.ShardsExchange(), key, t.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s with %q: %w", t.ShardsExchange(), t.Exchange, key, err)
		}
	}
	return nil
}

// ErrTopologyMismatch is returned (wrapped in a *TopologyMismatchError) by
// Consumer.Run and InstallTopology when the database holds a different
// topology for the consumer than its configuration describes.
var ErrTopologyMismatch = errors.New("consumer topology differs from the installed one")

// TopologyMismatchError says how the installed and configured topologies
// differ.
type TopologyMismatchError struct {
	Installed, Configured Topology
}

func (e *TopologyMismatchError) Error() string {
	return fmt.Sprintf("consumer %s was installed with shards=%d partitions=%d exchange=%q bindings=%q, "+
		"but is configured with shards=%d partitions=%d exchange=%q bindings=%q; "+
		"changing the topology is an explicit operation (docs/consumer.md, \"Changing S\")",
		e.Installed.Name, e.Installed.Shards, e.Installed.Partitions, e.Installed.Exchange, e.Installed.Bindings,
		e.Configured.Shards, e.Configured.Partitions, e.Configured.Exchange, e.Configured.Bindings)
}

func (e *TopologyMismatchError) Unwrap() error { return ErrTopologyMismatch }

const (
	sqlInstallTopology = `
INSERT INTO ordo_inbox_topology (consumer, shards, partitions, mapping, exchange, bindings, queue_prefix)
VALUES ($1, $2, $3, $4, $5, $6, $1)
ON CONFLICT DO NOTHING`

	sqlReadTopology = `
SELECT shards, partitions, mapping, exchange, bindings FROM ordo_inbox_topology WHERE consumer = $1`

	sqlSeedLeases = `
INSERT INTO ordo_inbox_leases (consumer, shard)
SELECT $1, s FROM generate_series(0, $2 - 1) AS s
ON CONFLICT DO NOTHING`
)

// InstallTopology records t in the database on first use, and checks it
// against the recorded one afterwards, returning a *TopologyMismatchError
// when they differ. It also creates t's lease rows.
func InstallTopology(ctx context.Context, db DB, t Topology) error {
	if _, err := db.Exec(ctx, sqlInstallTopology, t.Name, t.Shards, t.Partitions, MappingMod, t.Exchange, t.Bindings); err != nil {
		return fmt.Errorf("install topology: %w", err)
	}
	got := Topology{Name: t.Name}
	var mapping string
	if err := db.QueryRow(ctx, sqlReadTopology, t.Name).Scan(&got.Shards, &got.Partitions, &mapping, &got.Exchange, &got.Bindings); err != nil {
		return fmt.Errorf("read installed topology: %w", err)
	}
	if mapping != MappingMod || got.Shards != t.Shards || got.Partitions != t.Partitions ||
		got.Exchange != t.Exchange || !slices.Equal(got.Bindings, t.Bindings) {
		return &TopologyMismatchError{Installed: got, Configured: t}
	}
	if _, err := db.Exec(ctx, sqlSeedLeases, t.Name, t.Shards); err != nil {
		return fmt.Errorf("create lease rows: %w", err)
	}
	return nil
}
