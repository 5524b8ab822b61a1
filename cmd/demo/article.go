package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/orderapi"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// articleTable is the article's outbox table, as its EF Core model names it.
const articleTable = `"OutboxMessages"`

// The article service's SQL: the INSERT its endpoint's SaveChanges sends
// for an outbox message, and its own "was it sent?" query.
const (
	sqlArticleInsert = `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
VALUES ($1, $2, $3, $4, $5, $6)`
	sqlArticleUnprocessed = `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL AND "CorrelationId" = ANY($1)`
)

// ensureArticleTable creates the article's table (tablesource.ArticleDDL)
// in the database at dbURL unless it exists, and reports whether it did.
func ensureArticleTable(ctx context.Context, dbURL string) (created bool, err error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return false, fmt.Errorf("connect to the demo database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('public."OutboxMessages"') IS NOT NULL`).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for %s: %w", articleTable, err)
	}
	if exists {
		return false, nil
	}
	if _, err := conn.Exec(ctx, tablesource.ArticleDDL); err != nil {
		return false, fmt.Errorf("create %s: %w", articleTable, err)
	}
	return true, nil
}

// articleEvent is the payload the demo's article service writes.
type articleEvent struct {
	OrderID string `json:"orderId"`
	Event   string `json:"event"`
}

// writeArticleOrders writes n orders' OrderPlaced events into the
// article's table, one transaction each as the article's endpoint commits
// them, then an OrderCancelled event for every other order (the first,
// the third, ...), printing each row. The ids are UUIDv7, as the
// article's are; the correlation id is the order id.
func writeArticleOrders(ctx context.Context, con *console, dbURL string, n int) ([]placedOrder, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect to the demo database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	write := func(order, typ, routingKey string) error {
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		payload, err := json.Marshal(articleEvent{OrderID: order, Event: typ})
		if err != nil {
			return err
		}
		con.Printf("-> INSERT INTO %s (%s, %s, %s, %s)\n", articleTable, id, typ, routingKey, payload)
		if _, err := conn.Exec(ctx, sqlArticleInsert, id, typ, routingKey, payload, order, time.Now()); err != nil {
			return fmt.Errorf("write %s of order %s: %w", typ, order, err)
		}
		return nil
	}
	orders := make([]placedOrder, n)
	for i := range orders {
		orders[i].ID = uuid.NewString()
		if err := write(orders[i].ID, orderapi.TypeOrderPlaced, "order.placed"); err != nil {
			return nil, err
		}
	}
	for i := 0; i < n; i += 2 {
		if err := write(orders[i].ID, orderapi.TypeOrderCancelled, "order.cancelled"); err != nil {
			return nil, err
		}
		orders[i].Cancelled = true
	}
	return orders, nil
}

// showProcessed runs the article's own "was it sent?" query over this
// run's orders until none of their rows is unprocessed, or wait passes:
// the node sets "ProcessedAt" once the broker confirmed a row.
func showProcessed(ctx context.Context, con *console, dbURL string, orders []placedOrder, wait time.Duration) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to the demo database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	deadline := time.Now().Add(wait)
	for {
		var left int64
		if err := conn.QueryRow(ctx, sqlArticleUnprocessed, ids).Scan(&left); err != nil {
			return fmt.Errorf("count unprocessed rows: %w", err)
		}
		if left == 0 {
			con.Printf("%s: every row of this run has its \"ProcessedAt\" set (the article's own query finds none unsent)\n", articleTable)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d rows of this run still have no \"ProcessedAt\" after %v", left, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
