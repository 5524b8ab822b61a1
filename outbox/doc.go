// Package outbox holds Ordo's producer side: the outbox table contract, its
// embedded migrations, and Enqueue, which writes messages inside the
// caller's own PostgreSQL transaction.
//
// A service writes its business rows and its messages in one transaction:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `INSERT INTO orders ...`); err != nil {
//			return err
//		}
//		_, err := producer.Enqueue(ctx, tx, outbox.Message{
//			CorrelationID: orderID,
//			Exchange:      "bookstore.ordering",
//			RoutingKey:    "order.placed",
//			Type:          "bookstore.order-placed.v1",
//			Payload:       body,
//		})
//		return err
//	})
//
// Either both commit or neither does. Queue puts the same INSERT on a
// pgx.Batch instead, so that business rows and messages reach the database
// in one round trip: sent on a pool, a batch's statements are one implicit
// transaction (PostgreSQL commits them at the batch's Sync, or rolls them
// all back); the order API (package orderapi) places orders so.
//
// The database assigns each message its per-key sequence number (key_seq)
// and occurred_at, so producers in other languages that INSERT directly get
// the same guarantees; see docs/outbox-table.md for the exact DDL.
//
// # Schema
//
// The package owns the producers' side of the schema, created by Migrate
// from the embedded migrations/*.sql and recorded as component "outbox" in
// ordo_schema_migrations: the outbox table with its constraints,
// indexes and the partition range added at install; outbox_keys (the per-key counters); ordo_settings (the
// partition count, stored at install); the trigger functions
// outbox_assign_key_seq (key_seq, the producers' checks, and the
// wake-up on NotifyChannel); and ordo_operator_audit (created with the poison columns by migration
// 4; package admin writes it). The lease tables are package lease's.
// Its migrations 2 and 3 created them in earlier releases: 2 now creates
// only its own index and 3 nothing, and both versions stay so that every
// release finds versions 1 to 9 recorded.
package outbox
