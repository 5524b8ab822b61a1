package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(nil, func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{
		postgresURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		httpAddr:    "127.0.0.1:8080",
		partitions:  64,
		dbMaxConns:  10,
	}
	if cfg.postgresURL != want.postgresURL || cfg.httpAddr != want.httpAddr ||
		cfg.partitions != want.partitions || cfg.dbMaxConns != want.dbMaxConns ||
		cfg.api.Exchange != "bookstore.ordering" {
		t.Errorf("defaults = %+v", cfg)
	}
}

func TestParseConfigFlagsBeatEnvironment(t *testing.T) {
	env := map[string]string{
		"ORDO_POSTGRES_URL": "postgres://env@127.0.0.1/env",
		"ORDO_HTTP_ADDR":    "127.0.0.1:9000",
		"ORDO_EXCHANGE":     "from.env",
		"ORDO_PARTITIONS":   "32",
		"ORDO_DB_MAX_CONNS": "5",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := parseConfig([]string{"-exchange", "from.flag", "-db-max-conns", "7"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.postgresURL != env["ORDO_POSTGRES_URL"] || cfg.httpAddr != "127.0.0.1:9000" || cfg.partitions != 32 ||
		cfg.api.Exchange != "from.flag" || cfg.dbMaxConns != 7 {
		t.Errorf("config = %+v", cfg)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad env number", nil, map[string]string{"ORDO_PARTITIONS": "many"}, "ORDO_PARTITIONS"},
		{"zero conns", []string{"-db-max-conns", "0"}, nil, "db-max-conns"},
		{"unknown flag", []string{"-nope"}, nil, "nope"},
		{"stray argument", []string{"serve"}, nil, "serve"},
		{"empty address", []string{"-http-addr", ""}, nil, "http-addr"},
		{"long exchange", []string{"-exchange", strings.Repeat("x", 300)}, nil, "Exchange"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			_, err := parseConfig(tc.args, lookup, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := parseConfig([]string{"-h"}, nil, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v, want flag.ErrHelp", err)
	}
}

// logLines is an io.Writer that hands each log line to a channel.
type logLines struct {
	pw *io.PipeWriter
}

func newLogLines(tb testing.TB) (*logLines, <-chan string) {
	pr, pw := io.Pipe()
	lines := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			tb.Log(sc.Text())
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	tb.Cleanup(func() { pw.Close(); <-done })
	return &logLines{pw: pw}, lines
}

func (l *logLines) Write(p []byte) (int, error) { return l.pw.Write(p) }

func TestRunServesAndStopsGracefully(t *testing.T) {
	dbURL := testkit.NewDatabase(t)
	w, lines := newLogLines(t)
	logger := slog.New(slog.NewJSONHandler(w, nil))
	cfg, err := parseConfig([]string{"-postgres-url", dbURL, "-http-addr", "127.0.0.1:0", "-db-max-conns", "2", "-partitions", "8"},
		func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, logger) }()

	addr := waitListening(t, lines, done)
	body := `{"customerId":"0190f5c2-7d1e-7a3b-9c4d-5e6f708192a3","currency":"JPY",` +
		`"items":[{"bookId":"0190f5c3-0000-7000-8000-00000000000a","quantity":3,"unitPrice":500}]}`
	resp, err := http.Post("http://"+addr+"/orders", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(b), `"total":"1500"`) {
		t.Errorf("POST /orders = %d %s", resp.StatusCode, b)
	}
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"ordo_orderapi_requests_total 1", "# TYPE ordo_orderapi_request_duration_seconds histogram", "go_goroutines"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	http.DefaultClient.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30 s of cancel")
	}

	// A second start with another partition count is refused, clearly.
	cfg.partitions = 16
	err = run(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if !errors.Is(err, outbox.ErrPartitionMismatch) {
		t.Errorf("run with 16 partitions on an 8-partition outbox = %v, want ErrPartitionMismatch", err)
	}
}

// waitListening returns the address from the "orderapi listening" line.
func waitListening(t *testing.T, lines <-chan string, done <-chan error) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l := <-lines:
			if !strings.Contains(l, `"msg":"orderapi listening"`) {
				continue
			}
			_, rest, _ := strings.Cut(l, `"addr":"`)
			addr, _, _ := strings.Cut(rest, `"`)
			return addr
		case err := <-done:
			t.Fatalf("run returned before listening: %v", err)
		case <-deadline:
			t.Fatal("no \"orderapi listening\" line within 30 s")
		}
	}
}
