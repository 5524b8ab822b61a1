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
// Either both commit or neither does. The database assigns each message its
// per-key sequence number (key_seq) and occurred_at, so producers in other
// languages that INSERT directly get the same guarantees; see
// docs/outbox-table.md for the exact DDL.
package outbox
