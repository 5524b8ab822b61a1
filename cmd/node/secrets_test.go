package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// withPassword returns rawURL with its user's password set to password.
func withPassword(t *testing.T, rawURL, password string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// body returns the status and body of GET url.
func body(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestNoSecretsInOutput starts a node whose PostgreSQL and AMQP URLs hold
// passwords (PostgreSQL's trust auth ignores its password; RabbitMQ refuses
// the AMQP one, so the broker's error path runs), cuts the database, and
// checks that neither password appears in any log line, /status, /readyz
// or error body, and that /readyz does not echo connection details. A
// second node, whose AMQP URL does not parse, must refuse to start without
// printing its password either.
func TestNoSecretsInOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pgSecret, amqpSecret, badSecret := "pg-Secret-7d1e9a", "amqp-Secret-4b2c8f", "url-Secret-93af01"
	proxy := testkit.NewProxy(t, testkit.HostPort(t, f.dbURL))
	pgURL := withPassword(t, proxy.URL(f.dbURL), pgSecret)
	amqpURL := "amqp://ordo-no-such-user:" + amqpSecret + "@" + testkit.HostPort(t, testkit.AMQPURL()) + "/"
	p, base := f.start(t, "secrets-node", "ORDO_POSTGRES_URL="+pgURL, "ORDO_AMQP_URL="+amqpURL)

	var bodies []string
	get := func(path string, want int) string {
		code, b := body(t, base+path)
		if code != want {
			t.Fatalf("GET %s = %d %s, want %d", path, code, b, want)
		}
		bodies = append(bodies, path+": "+b)
		return b
	}
	p.WaitOutput(t, "RabbitMQ unavailable", 30*time.Second)
	get("/status", http.StatusOK)
	get("/readyz", http.StatusServiceUnavailable)

	proxy.Cut()
	p.WaitOutput(t, "lease database unavailable", 30*time.Second)
	ready := get("/readyz", http.StatusServiceUnavailable)
	if !strings.Contains(ready, "database unreachable") {
		t.Errorf("/readyz with the database cut does not say so: %s", ready)
	}
	for _, detail := range []string{proxy.Addr(), "user=", "database=", "dial"} {
		if strings.Contains(ready, detail) {
			t.Errorf("/readyz echoes connection details (%q): %s", detail, ready)
		}
	}
	get("/status", http.StatusServiceUnavailable)
	proxy.Restore()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	// An AMQP URL that does not parse (an unescaped % in the password).
	bad := testkit.StartProcess(t, "bad-url-node", f.bin, []string{"-http-addr", testkit.FreeAddr(t)},
		[]string{"ORDO_POSTGRES_URL=" + pgURL, "ORDO_AMQP_URL=amqp://guest:50%off-" + badSecret + "@127.0.0.1:5672/"})
	if code, err := bad.Wait(30 * time.Second); err != nil || code == 0 {
		t.Errorf("a node with a malformed AMQP URL: exit %d (%v), want a refusal", code, err)
		bad.Kill()
	}
	if !strings.Contains(bad.Output(), "amqp-url") {
		t.Errorf("the refusal does not name -amqp-url:\n%s", bad.Output())
	}

	out := p.Output() + bad.Output() + strings.Join(bodies, "\n")
	for _, secret := range []string{pgSecret, amqpSecret, badSecret} {
		if strings.Contains(out, secret) {
			t.Errorf("password %q appears in the output:\n%s", secret, linesWith(out, secret))
		}
	}
}

// linesWith returns the lines of s that contain sub.
func linesWith(s, sub string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}

// TestHTTPLimits: the node's HTTP server refuses oversized headers and
// does not wait forever for a request body that never comes.
func TestHTTPLimits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, base := f.start(t, "limits-node", "ORDO_ADMIN_TOKEN=t0k")

	req, _ := http.NewRequest(http.MethodGet, base+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("b", 100<<10))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("100 KiB of headers: %d, want 431", resp.StatusCode)
	}

	// A body announced and never sent: the server must give up on it.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /admin/gossip-key HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(45 * time.Second))
	_, err = io.ReadAll(conn) // until the server closes the connection
	if err != nil {
		t.Fatalf("the server kept a connection whose body never came for %v: %v", time.Since(start).Round(time.Second), err)
	}
	t.Logf("connection closed %v after the headers", time.Since(start).Round(time.Millisecond))
}
