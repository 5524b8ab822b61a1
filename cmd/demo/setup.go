package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/internal/childproc"
)

// The demo's SQL: it only ever creates its database.
const (
	sqlDatabaseExists = `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`
	// sqlCreateDatabase is completed with a sanitised identifier.
	sqlCreateDatabase = `CREATE DATABASE `
)

// SQLSTATE duplicate_database: another demo created it first.
const pgDuplicateDatabase = "42P04"

// ensureDatabase creates database name on the server of adminURL unless it
// exists, and returns the URL of that database. It reports whether it
// created it.
func ensureDatabase(ctx context.Context, adminURL, name string) (dbURL string, created bool, err error) {
	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", false, fmt.Errorf("-postgres-url: want a postgres:// URL, got %q", adminURL)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, adminURL)
	if err != nil {
		return "", false, fmt.Errorf("connect to PostgreSQL at %s (is it running? see -postgres-url): %w", u.Host, err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(cctx, sqlDatabaseExists, name).Scan(&exists); err != nil {
		return "", false, fmt.Errorf("look for database %s: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(cctx, sqlCreateDatabase+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			created = true
		case errors.As(err, &pgErr) && pgErr.Code == pgDuplicateDatabase:
		default:
			return "", false, fmt.Errorf("create database %s: %w", name, err)
		}
	}
	u.Path = "/" + name
	return u.String(), created, nil
}

// The programs the demo runs, by import path so that go build finds them
// from any directory of the module.
const (
	pkgNode     = "github.com/ordo-relay/ordo/cmd/node"
	pkgOrderAPI = "github.com/ordo-relay/ordo/cmd/orderapi"
)

// buildBinaries builds the node and, with api, the order API, side by
// side, with the builder (childproc.Build: go build, into a directory
// childproc.RemoveBinaries deletes) and returns their paths.
func buildBinaries(ctx context.Context, api bool) (node, orderapi string, err error) {
	if _, err := exec.LookPath("go"); err != nil {
		return "", "", fmt.Errorf("the go command is needed to build the services: %w", err)
	}
	var g errgroup.Group
	g.Go(func() (err error) { node, _, err = childproc.Build(ctx, pkgNode); return err })
	if api {
		g.Go(func() (err error) { orderapi, _, err = childproc.Build(ctx, pkgOrderAPI); return err })
	}
	if err := g.Wait(); err != nil {
		return "", "", fmt.Errorf("run the demo from the repository (go run ./cmd/demo): %w", err)
	}
	return node, orderapi, nil
}

// broker is the demo's side of RabbitMQ: one connection, one channel, and
// the deliveries of the demo queue.
type broker struct {
	conn       *amqp.Connection
	deliveries <-chan amqp.Delivery
}

// openBroker declares cfg.Exchange (a durable topic exchange: the node
// only checks that it exists), declares the demo's queue, binds it with
// order.* and starts consuming with automatic acks. Close ends it all.
func openBroker(cfg config) (*broker, error) {
	u, err := url.Parse(cfg.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("-amqp-url: %w", err)
	}
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{
		Dial:       amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{"connection_name": "ordo-demo"},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s (is it running? see -amqp-url): %w", u.Host, err)
	}
	b := &broker{conn: conn}
	if err := b.setup(cfg); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *broker) setup(cfg config) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open AMQP channel: %w", err)
	}
	if err := ch.ExchangeDeclare(cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s (an existing exchange of that name must be a durable topic exchange): %w", cfg.Exchange, err)
	}
	// Not durable, auto-delete and exclusive: the queue lives as long as
	// this demo's connection, and a second demo running at the same time
	// is refused instead of taking half of the messages.
	if _, err := ch.QueueDeclare(cfg.Queue, false, true, true, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
			return fmt.Errorf("queue %s is in use: is another demo running? %w", cfg.Queue, err)
		}
		return fmt.Errorf("declare queue %s: %w", cfg.Queue, err)
	}
	if err := ch.QueueBind(cfg.Queue, "order.*", cfg.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", cfg.Queue, cfg.Exchange, err)
	}
	d, err := ch.Consume(cfg.Queue, "ordo-demo", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume from %s: %w", cfg.Queue, err)
	}
	b.deliveries = d
	return nil
}

// Close closes the connection, which deletes the queue and ends the
// deliveries channel. It is idempotent.
func (b *broker) Close() {
	if !b.conn.IsClosed() {
		_ = b.conn.Close()
	}
}
