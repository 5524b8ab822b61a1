package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/orderapi"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseConfig(t *testing.T) {
	defaults := config{
		PostgresURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		Database:    "ordo_demo",
		AMQPURL:     "amqp://guest:guest@127.0.0.1:5672/",
		Exchange:    "bookstore.ordering",
		Queue:       "bookstore.demo",
		Orders:      3,
		Partitions:  64,
		Wait:        30 * time.Second,
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(c *config)
		wantErr string
	}{
		{name: "defaults", want: func(*config) {}},
		{
			name: "environment",
			env:  map[string]string{"ORDO_ORDERS": "7", "ORDO_KEEP": "true", "ORDO_DATABASE": "other_db"},
			want: func(c *config) { c.Orders, c.Keep, c.Database = 7, true, "other_db" },
		},
		{
			name: "flags beat the environment",
			args: []string{"-orders", "5", "-wait", "5s"},
			env:  map[string]string{"ORDO_ORDERS": "7"},
			want: func(c *config) { c.Orders, c.Wait = 5, 5*time.Second },
		},
		{
			name: "the article's table",
			args: []string{"-table-layout", "article"},
			want: func(c *config) { c.TableLayout, c.Database = "article", "ordo_demo_article" },
		},
		{
			name: "the article's table in a database given",
			env:  map[string]string{"ORDO_TABLE_LAYOUT": "article", "ORDO_DATABASE": "shop"},
			want: func(c *config) { c.TableLayout, c.Database = "article", "shop" },
		},
		{name: "another layout", args: []string{"-table-layout", "app.outbox"}, wantErr: "the article's table only"},
		{name: "keep with the article's table", args: []string{"-table-layout", "article", "-keep"}, wantErr: "-keep places orders through the order API"},
		{name: "no orders", args: []string{"-orders", "0"}, wantErr: "-orders 0"},
		{name: "database name not an identifier", args: []string{"-database", "ordo-demo"}, wantErr: "-database"},
		{name: "bad environment value", env: map[string]string{"ORDO_ORDERS": "many"}, wantErr: "ORDO_ORDERS"},
		{name: "arguments", args: []string{"extra"}, wantErr: "unexpected arguments"},
		{name: "help", args: []string{"-h"}, wantErr: flag.ErrHelp.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			got, err := parseConfig(tt.args, lookup, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseConfig error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := defaults
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("parseConfig = %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestEvents checks the per-order bookkeeping that decides whether the
// demo succeeds: it must notice a missing event, an event that arrives
// before its predecessor, and tell duplicates and strangers apart.
func TestEvents(t *testing.T) {
	orders := []placedOrder{{ID: "a", Cancelled: true}, {ID: "b"}}
	type arrival struct {
		order  string
		keySeq int64  // 1 placed, 2 cancelled
		remark string // substring of the remark; "" for none
	}
	tests := []struct {
		name     string
		arrivals []arrival
		done     bool
		missing  []string
		wrong    int
	}{
		{
			name:     "all in order",
			arrivals: []arrival{{"a", 1, ""}, {"b", 1, ""}, {"a", 2, ""}},
			done:     true,
		},
		{
			name:     "cancel before place",
			arrivals: []arrival{{"b", 1, ""}, {"a", 2, "OUT OF ORDER"}, {"a", 1, "OUT OF ORDER"}},
			done:     true,
			wrong:    2,
		},
		{
			name:     "missing cancel",
			arrivals: []arrival{{"a", 1, ""}, {"b", 1, ""}},
			missing:  []string{"order a " + orderapi.TypeOrderCancelled},
		},
		{
			name: "duplicate, stranger and unexpected",
			arrivals: []arrival{{"a", 1, ""}, {"a", 1, "duplicate"}, {"zzz", 1, "not from this run"},
				{"b", 1, ""}, {"b", 2, "unexpected"}},
			missing: []string{"order a " + orderapi.TypeOrderCancelled},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEvents(orders)
			if e.total != 3 {
				t.Fatalf("total = %d, want 3", e.total)
			}
			for _, a := range tt.arrivals {
				typ := orderapi.TypeOrderPlaced
				if a.keySeq == 2 {
					typ = orderapi.TypeOrderCancelled
				}
				d := testkit.Delivery{MessageID: fmt.Sprintf("%s-%d", a.order, a.keySeq), CorrelationID: a.order, Type: typ, KeySeq: a.keySeq}
				r := e.record(d)
				if (a.remark == "") != (r == "") || !strings.Contains(r, a.remark) {
					t.Errorf("record(%s, %d) = %q, want a remark containing %q", a.order, a.keySeq, r, a.remark)
				}
			}
			if e.done() != tt.done {
				t.Errorf("done = %v, want %v", e.done(), tt.done)
			}
			if got := e.missing(); !reflect.DeepEqual(got, tt.missing) {
				t.Errorf("missing = %q, want %q", got, tt.missing)
			}
			if got := e.outOfOrder(); len(got) != tt.wrong {
				t.Errorf("out of order = %q, want %d", got, tt.wrong)
			}
		})
	}
}

// TestDemo runs the whole demo against the real servers, with a database,
// exchange and queue of its own, and checks that it reports every event.
func TestDemo(t *testing.T) {
	testkit.RequirePostgres(t)
	testkit.RequireRabbitMQ(t)
	cfg := config{
		PostgresURL: testkit.PostgresURL(),
		Database:    testkit.UniqueName(t, "ordo_demo"),
		AMQPURL:     testkit.AMQPURL(),
		Exchange:    testkit.NewExchange(t),
		Queue:       testkit.UniqueName(t, "q"),
		Orders:      4,
		Partitions:  8,
		Wait:        30 * time.Second,
	}
	t.Cleanup(func() { dropDatabase(t, cfg.Database) })

	var out, errw bytes.Buffer
	ctx := testkit.Context(t, 2*time.Minute)
	start := time.Now()
	err := run(ctx, cfg, newConsole(&out, &errw))
	t.Logf("demo ran for %v\n--- stdout\n%s--- stderr\n%s", time.Since(start).Round(time.Millisecond), out.String(), errw.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	got := out.String()
	for _, want := range []string{
		"created database " + cfg.Database,
		"all 6 events arrived",
		"outbox: 0 pending",
		"node stopped",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(got, "\norder.placed "); n != 4 {
		t.Errorf("%d order.placed events printed, want 4", n)
	}
	if n := strings.Count(got, "\norder.cancelled "); n != 2 {
		t.Errorf("%d order.cancelled events printed, want 2", n)
	}
	if !strings.Contains(errw.String(), "[node] ") || !strings.Contains(errw.String(), "[orderapi] ") {
		t.Errorf("the services' output is not prefixed on stderr")
	}
}

// TestDemoArticleTable: with -table-layout article the demo writes its
// events into the article's own table, the node relays it as it is, and
// every event arrives in order with every row's "ProcessedAt" set.
func TestDemoArticleTable(t *testing.T) {
	testkit.RequirePostgres(t)
	testkit.RequireRabbitMQ(t)
	cfg := config{
		PostgresURL: testkit.PostgresURL(),
		Database:    testkit.UniqueName(t, "ordo_demo_article"),
		AMQPURL:     testkit.AMQPURL(),
		Exchange:    testkit.NewExchange(t),
		Queue:       testkit.UniqueName(t, "q"),
		Orders:      4,
		Partitions:  8,
		Wait:        30 * time.Second,
		TableLayout: "article",
	}
	t.Cleanup(func() { dropDatabase(t, cfg.Database) })

	var out, errw bytes.Buffer
	ctx := testkit.Context(t, 2*time.Minute)
	err := run(ctx, cfg, newConsole(&out, &errw))
	t.Logf("--- stdout\n%s--- stderr\n%s", out.String(), errw.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	got := out.String()
	for _, want := range []string{
		"created \"OutboxMessages\" exactly as the article's EF Core model does",
		"all 6 events arrived",
		"every row of this run has its \"ProcessedAt\" set",
		"node stopped",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(errw.String(), "[orderapi] ") {
		t.Errorf("the order API ran beside the article's table")
	}
}

// dropDatabase drops name, closing any connection left.
func dropDatabase(tb testing.TB, name string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testkit.PostgresURL())
	if err != nil {
		tb.Errorf("drop database %s: %v", name, err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil && !errors.Is(err, context.Canceled) {
		tb.Errorf("drop database %s: %v", name, err)
	}
}
