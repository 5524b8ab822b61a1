package testkit

import (
	"context"
	"fmt"
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, drop, err := CreateDatabase(ctx, PostgresURL(), name)
	if err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := drop(ctx); err != nil {
			tb.Errorf("drop test database %s: %v", name, err)
		}
	})
	return u
}

// CreateDatabase creates the empty database name on the server adminURL
// points at, and returns its URL and a function that drops it (with FORCE,
// closing any connection left). It is NewDatabase for programs that are
// not tests (the bench), which choose their own names.
func CreateDatabase(ctx context.Context, adminURL, name string) (dbURL string, drop func(context.Context) error, err error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("postgres url: %w", err)
	}
	ident := pgx.Identifier{name}.Sanitize()
	exec := func(ctx context.Context, sql string) error {
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return fmt.Errorf("connect to PostgreSQL: %w", err)
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop = func(ctx context.Context) error {
		return exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	}
	u.Path = "/" + name
	return u.String(), drop, nil
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

// NewDatabasePool is NewDatabase plus NewPool with maxConns connections.
func NewDatabasePool(tb testing.TB, maxConns int32) (string, *pgxpool.Pool) {
	tb.Helper()
	u := NewDatabase(tb)
	return u, NewPool(tb, u, maxConns)
}
