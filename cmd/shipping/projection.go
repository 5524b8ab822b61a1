package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/orderapi"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrate creates the projection's tables (component "shipping").
func migrate(ctx context.Context, db inbox.TxBeginner) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "shipping", migrations, "migrations")
	})
}

// errCancelledBeforePlaced is what the projection would hit if the inbox
// let an OrderCancelled through before its OrderPlaced. It never should;
// if it does, the message is retried and then dead-lettered, visibly.
var errCancelledBeforePlaced = errors.New("order cancelled before it was placed")

type orderPlaced struct {
	OrderID    string `json:"orderId"`
	CustomerID string `json:"customerId"`
	Currency   string `json:"currency"`
	Total      string `json:"total"`
	PlacedAt   string `json:"placedAt"`
}

type orderCancelled struct {
	OrderID     string `json:"orderId"`
	CancelledAt string `json:"cancelledAt"`
}

// projector returns the inbox's handler: it queues the statements that
// apply OrderPlaced and OrderCancelled to shipping_orders and record every
// message it handles in shipping_events; the inbox sends them in its
// transaction, a batch's together with its own (inbox.QueueHandler).
func projector(instance string) inbox.QueueHandler {
	return func(_ context.Context, m *inbox.Message, b *pgx.Batch) error {
		var err error
		switch m.Type {
		case orderapi.TypeOrderPlaced:
			err = queuePlaced(b, m)
		case orderapi.TypeOrderCancelled:
			err = queueCancelled(b, m)
		}
		if err != nil {
			return err
		}
		b.Queue(`INSERT INTO shipping_events (order_id, key_seq, type, message_id, instance)
			VALUES ($1, $2, $3, $4, $5)`, m.CorrelationID, m.KeySeq, m.Type, m.ID, instance)
		return nil
	}
}

func queuePlaced(b *pgx.Batch, m *inbox.Message) error {
	var e orderPlaced
	if err := json.Unmarshal(m.Body, &e); err != nil {
		return fmt.Errorf("decode OrderPlaced: %w", err)
	}
	b.Queue(`INSERT INTO shipping_orders (order_id, status, customer_id, currency, total, placed_at)
		VALUES ($1, 'placed', $2, $3, $4, $5::timestamptz)`,
		m.CorrelationID, e.CustomerID, e.Currency, e.Total, nullString(e.PlacedAt))
	return nil
}

func queueCancelled(b *pgx.Batch, m *inbox.Message) error {
	var e orderCancelled
	if err := json.Unmarshal(m.Body, &e); err != nil {
		return fmt.Errorf("decode OrderCancelled: %w", err)
	}
	b.Queue(`UPDATE shipping_orders SET status = 'cancelled', cancelled_at = $2::timestamptz, updated_at = now()
		WHERE order_id = $1 AND status = 'placed'`, m.CorrelationID, nullString(e.CancelledAt)).
		Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("order %s: %w", m.CorrelationID, errCancelledBeforePlaced)
			}
			return nil
		})
	return nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
