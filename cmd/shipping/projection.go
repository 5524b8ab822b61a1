package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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

// projector returns the inbox handler: it applies OrderPlaced and
// OrderCancelled to shipping_orders and records every message it handles
// in shipping_events, all in the inbox's transaction.
func projector(instance string) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		var err error
		switch m.Type {
		case orderapi.TypeOrderPlaced:
			err = applyPlaced(ctx, tx, m)
		case orderapi.TypeOrderCancelled:
			err = applyCancelled(ctx, tx, m)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO shipping_events (order_id, key_seq, type, message_id, instance)
			VALUES ($1, $2, $3, $4, $5)`, m.CorrelationID, m.KeySeq, m.Type, m.ID, instance); err != nil {
			return fmt.Errorf("record event: %w", err)
		}
		return nil
	}
}

func applyPlaced(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	var e orderPlaced
	if err := json.Unmarshal(m.Body, &e); err != nil {
		return fmt.Errorf("decode OrderPlaced: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shipping_orders (order_id, status, customer_id, currency, total, placed_at)
		VALUES ($1, 'placed', $2, $3, $4, $5::timestamptz)`,
		m.CorrelationID, e.CustomerID, e.Currency, e.Total, nullString(e.PlacedAt)); err != nil {
		return fmt.Errorf("project OrderPlaced: %w", err)
	}
	return nil
}

func applyCancelled(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	var e orderCancelled
	if err := json.Unmarshal(m.Body, &e); err != nil {
		return fmt.Errorf("decode OrderCancelled: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE shipping_orders SET status = 'cancelled', cancelled_at = $2::timestamptz, updated_at = now()
		WHERE order_id = $1 AND status = 'placed'`, m.CorrelationID, nullString(e.CancelledAt))
	if err != nil {
		return fmt.Errorf("project OrderCancelled: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("order %s: %w", m.CorrelationID, errCancelledBeforePlaced)
	}
	return nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
