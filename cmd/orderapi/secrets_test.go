package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestNoSecretsInOutput runs the API with a PostgreSQL URL holding a
// password (trust auth ignores it), cuts the database, and checks that the
// password appears in no log line or answer and that answers do not echo
// connection details. A URL that does not parse must not be quoted with
// its password either. Oversized headers are refused.
func TestNoSecretsInOutput(t *testing.T) {
	const secret = "api-Secret-5e1f77"
	dbURL := testkit.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testkit.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	u.User = url.UserPassword(u.User.Username(), secret)

	var log testkit.Buffer
	w, lines := newLogLines(t)
	logger := slog.New(slog.NewJSONHandler(io.MultiWriter(w, &log), nil))
	cfg, err := parseConfig([]string{"-postgres-url", u.String(), "-http-addr", "127.0.0.1:0", "-db-max-conns", "2", "-partitions", "8"},
		func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, logger) }()
	base := "http://" + waitListening(t, lines, done)

	client := &http.Client{Timeout: 30 * time.Second}
	var answers []string
	call := func(method, path, body string, header http.Header, want int) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header = header
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s %s = %d %s, want %d", method, path, resp.StatusCode, b, want)
		}
		answers = append(answers, string(b))
	}
	order := `{"customerId":"0190f5c2-7d1e-7a3b-9c4d-5e6f708192a3","currency":"EUR",` +
		`"items":[{"bookId":"0190f5c3-0000-7000-8000-00000000000a","quantity":1,"unitPrice":"5"}]}`
	call("POST", "/orders", order, http.Header{}, http.StatusCreated)
	call("GET", "/healthz", "", http.Header{"X-Big": {strings.Repeat("b", 100<<10)}}, http.StatusRequestHeaderFieldsTooLarge)
	proxy.Cut()
	call("POST", "/orders", order, http.Header{}, http.StatusInternalServerError)
	call("GET", "/healthz", "", http.Header{}, http.StatusServiceUnavailable)
	proxy.Restore()
	client.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run = %v", err)
	}

	// A URL that does not parse (an unescaped % in the password).
	cfg.postgresURL = "postgres://postgres:50%off-" + secret + "@" + proxy.Addr() + "/postgres"
	runErr := run(context.Background(), cfg, logger)
	if runErr == nil || !strings.Contains(runErr.Error(), "postgres-url") {
		t.Errorf("run with a malformed URL = %v, want an error naming -postgres-url", runErr)
	}

	out := log.String() + strings.Join(answers, "\n") + "\n" + runErr.Error()
	if strings.Contains(out, secret) {
		t.Errorf("the password appears in the output:\n%s", out)
	}
	for _, a := range answers {
		if strings.Contains(a, proxy.Addr()) || strings.Contains(a, "user=") {
			t.Errorf("an answer echoes connection details: %s", a)
		}
	}
}
