package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/childproc"
)

// pkgShipping is the example consumer the demo runs in -keep mode.
const pkgShipping = "github.com/ordo-relay/ordo/cmd/shipping"

// shippingInstances is how many shipping instances -keep runs: they share
// the consumer group's shard queues (docs/consumer.md).
const shippingInstances = 3

// startShipping builds cmd/shipping (childproc.Build) and starts shippingInstances
// instances of it on database <cfg.Database>_shipping (which shipping
// creates), consuming cfg.Exchange, and waits until each consumes. It
// returns them and the database's URL. Stop them with stopShipping.
func startShipping(ctx context.Context, con *console, cfg config) ([]*child, string, error) {
	bin, _, err := childproc.Build(ctx, pkgShipping)
	if err != nil {
		return nil, "", err
	}
	u, err := url.Parse(cfg.PostgresURL)
	if err != nil {
		return nil, "", fmt.Errorf("-postgres-url: %w", err)
	}
	db := cfg.Database + "_shipping"
	if len(db) > 63 {
		db = db[len(db)-63:]
	}
	u.Path = "/" + db
	var kids []*child
	for i := 1; i <= shippingInstances; i++ {
		name := "shipping" + strconv.Itoa(i)
		c, err := startChild(con, name, bin, childEnv(
			"ORDO_POSTGRES_URL="+u.String(),
			"ORDO_AMQP_URL="+cfg.AMQPURL,
			"ORDO_EXCHANGE="+cfg.Exchange,
			"ORDO_PARTITIONS="+strconv.Itoa(cfg.Partitions),
			"ORDO_INSTANCE="+name,
			"ORDO_LEASE_TTL=2s",
			"ORDO_DB_MAX_CONNS=6",
			"ORDO_STATS_EVERY=30s",
		))
		if err != nil {
			return nil, "", errors.Join(err, stopShipping(kids))
		}
		kids = append(kids, c)
	}
	if err := waitShipping(ctx, u.String(), cfg.Wait); err != nil {
		return nil, "", errors.Join(err, stopShipping(kids))
	}
	con.Printf("%d shipping instances keep the order projection in database %s (table shipping_orders);\n"+
		"they share consumer group \"shipping\"'s shard queues; see docs/consumer.md\n", shippingInstances, db)
	return kids, u.String(), nil
}

// waitShipping waits until the shipping instances have declared their
// queues and claimed every shard, so that no order event is published
// before the shard queues exist.
func waitShipping(ctx context.Context, dbURL string, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		if n, err := countRows(wctx, dbURL, `SELECT count(*) FROM ordo_inbox_leases
			WHERE consumer = 'shipping' AND owner IS NOT NULL AND expires_at > now()`); err == nil && n == 8 {
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("shipping instances did not claim their shards within %v (see their output above)", wait)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// showProjection waits until shipping has handled want events and prints
// the order projection.
func showProjection(ctx context.Context, con *console, dbURL string, want int, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		n, err := countRows(wctx, dbURL, `SELECT count(*) FROM shipping_events`)
		if err == nil && n >= want {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("shipping handled %d of %d events within %v: %v", n, want, wait, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	conn, err := pgx.Connect(wctx, dbURL)
	if err != nil {
		return fmt.Errorf("read the shipping projection: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(wctx, `SELECT order_id, status FROM shipping_orders ORDER BY placed_at, order_id`)
	if err != nil {
		return fmt.Errorf("read the shipping projection: %w", err)
	}
	var id, status string
	con.Step("The shipping projection (shipping_orders), each event handled once and in order")
	_, err = pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		con.Printf("  %s  %s\n", id, status)
		return nil
	})
	return err
}

func countRows(ctx context.Context, dbURL, sql string) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, sql).Scan(&n)
	return n, err
}

// stopShipping stops the instances, each with stopGrace.
func stopShipping(kids []*child) error {
	var errs []error
	for _, c := range kids {
		errs = append(errs, c.Stop(stopGrace))
	}
	return errors.Join(errs...)
}
