package testkit

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NewDatabase creates an empty database of its own for tb, dropped (with
// FORCE, closing any connection left) when tb ends, and returns its URL.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	RequirePostgres(tb)
	name := UniqueName(tb, "ordo_t")
	admin := adminConn(tb)
	defer admin.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("create test database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		c := adminConn(tb)
		defer c.Close(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("drop test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(PostgresURL())
	if err != nil {
		tb.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func adminConn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, PostgresURL())
	if err != nil {
		tb.Fatalf("connect to PostgreSQL admin database: %v", err)
	}
	return c
}

// NewPool opens a pool of at most maxConns connections to dbURL, closed when
// tb ends. Keep maxConns small: every test shares one server's 100
// connections.
func NewPool(tb testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatalf("parse %s: %v", dbURL, err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// NewTestDB is NewDatabase plus NewPool with maxConns connections.
func NewTestDB(tb testing.TB, maxConns int32) (string, *pgxpool.Pool) {
	tb.Helper()
	u := NewDatabase(tb)
	return u, NewPool(tb, u, maxConns)
}
