// Package inbox is the consumer side of Ordo. Ordo publishes each key's
// messages in order, at least once; the inbox turns that into "each
// message handled once, each key in order" for a consumer group of any
// number of instances, inside the consumer's own PostgreSQL transaction.
//
// # The per-key rule
//
// Every Ordo message carries its key (the AMQP correlation-id), its
// x-ordo-key-seq (1, 2, 3, ... per key) and x-ordo-prev-key-seq (the
// previous key_seq the producer did not skip). A key belongs to a source,
// the outbox database named by x-ordo-source (wire.DefaultSource when
// absent): key_seq counts per (source, key), and so does the inbox. The
// inbox keeps one row per key with the last handled key_seq, and decides
// under that row's lock:
//
//   - key_seq <= last: a duplicate (a republish, a redelivery): dropped.
//   - prev <= last:    the next message: the handler runs in the same
//     transaction that advances last, so both commit or neither does.
//   - prev > last:     a gap: the message is stored in the inbox table and
//     acknowledged; it runs once its predecessor has. A gap that waits
//     longer than Config.GapWait makes its key "stuck" for an operator
//     (Stuck, Resolve).
//
// A handler error (or panic) rolls its transaction back; the failure is
// recorded outside it and the message retried from the inbox table with
// backoff, never by an immediate requeue. After Config.MaxAttempts it goes
// to the dead-letter queue and its key waits (Dead, Retry, Skip). A
// redelivered message counts as one attempt before its handler runs, so a
// handler that crashes the process also reaches the dead-letter queue.
//
// # Shards and ownership
//
// A Consumer spreads the messages over S shard queues by x-ordo-partition
// (shard = partition mod S) through a headers exchange (see Topology), and
// each shard is consumed by one instance at a time: an exclusive AMQP
// consumer held by the owner of the shard's lease in the consumer's
// database. Instances heartbeat a member row; every instance assigns the
// shards over the live members with partition.Assign, claims what it
// should own (bumping the lease epoch) and hands back the rest after its
// worker finished the message in hand. Every inbox write checks the lease
// owner and epoch in its own transaction (ErrFenced), so a paused
// instance's late commit is refused; order and once-only handling do not
// depend on the leases, only on the key rows, so even overlapping owners
// would not break them.
//
// # Use
//
//	pool, _ := pgxpool.New(ctx, "postgres://.../shipping")
//	cfg := inbox.DefaultConfig("shipping")
//	cfg.Exchange = "bookstore.ordering"
//	cfg.Bindings = []string{"order.*"}
//	c, err := inbox.New(cfg, pool, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
//		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'cancelled' WHERE id = $1`, m.CorrelationID)
//		return err
//	})
//	if err != nil { ... }
//	err = c.Run(ctx) // until ctx is cancelled
//
// New fills the Config fields left zero from DefaultConfig; TLS and other
// AMQP connection settings go in Config.AMQPConfig.
//
// A handler whose writes do not depend on what its own statements return
// can queue them instead (QueueHandler, NewQueued): the inbox sends a
// batch's statements with its own in one round trip, so a batch of
// messages takes three round trips whatever its size.
//
// Store is the decision logic alone, for a program with its own AMQP loop:
// call Store.Handle for each delivery and acknowledge it when Handle
// returns nil, and call Store.RetryDue periodically.
//
// docs/consumer.md describes the guarantees, the tables, the broker
// layout, changing S (Reshard), and the limits.
package inbox
