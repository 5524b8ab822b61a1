// Package relay publishes outbox rows to RabbitMQ, per key in key_seq order,
// with publisher confirms, and marks them processed only once the broker has
// confirmed and routed them.
//
// A Relay reads key heads (the lowest pending row of each key not already in
// flight) from the partitions its node holds, publishes them through a
// Publisher, and settles each one:
//
//   - Confirmed: acked and not returned. Marked processed in one
//     epoch-checked UPDATE per batch.
//   - Nacked, Returned, Failed: the row stays pending; its attempts and
//     last_error are recorded and its key waits a backoff before retrying.
//   - Unsent: the channel or connection closed first. Nothing is recorded;
//     the row is read again.
//
// At most one message of a key is unconfirmed or unmarked at once, and at
// most Window messages of the node are unconfirmed. Together they keep each key in order while the pipeline stays full across keys.
package relay
