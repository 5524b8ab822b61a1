package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Default server addresses: the local servers every developer machine and CI
// run. Only 127.0.0.1 is ever used.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// PostgresURL is the admin URL of the test PostgreSQL server.
func PostgresURL() string { return envOr("ORDO_TEST_POSTGRES_URL", DefaultPostgresURL) }

// AMQPURL is the URL of the test RabbitMQ server.
func AMQPURL() string { return envOr("ORDO_TEST_AMQP_URL", DefaultAMQPURL) }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// InCI reports whether the CI environment variable is set.
func InCI() bool { return os.Getenv("CI") != "" }

var reachable sync.Map // host:port -> error

// requireServer skips (outside CI) or fails (in CI) tb when the server at
// rawURL does not accept TCP connections.
func requireServer(tb testing.TB, name, envVar, rawURL string) {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatalf("%s=%q: %v", envVar, rawURL, err)
	}
	addr := u.Host
	v, ok := reachable.Load(addr)
	if !ok {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		v, _ = reachable.LoadOrStore(addr, err)
	}
	if err, _ := v.(error); err != nil {
		msg := fmt.Sprintf("%s at %s is not reachable (%v); start it or set %s", name, addr, err, envVar)
		if InCI() {
			tb.Fatal(msg + " (CI is set, so integration tests must run)")
		}
		tb.Skip(msg + " to run this integration test")
	}
}

// RequirePostgres skips or fails tb when PostgreSQL is unreachable.
func RequirePostgres(tb testing.TB) {
	tb.Helper()
	requireServer(tb, "PostgreSQL", "ORDO_TEST_POSTGRES_URL", PostgresURL())
}

// RequireRabbitMQ skips or fails tb when RabbitMQ is unreachable.
func RequireRabbitMQ(tb testing.TB) {
	tb.Helper()
	requireServer(tb, "RabbitMQ", "ORDO_TEST_AMQP_URL", AMQPURL())
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns a name unique to this test run, built from the test's
// name and random bytes: lower-case letters, digits and '_' only, at most 48
// bytes (PostgreSQL identifiers allow 63), so it is safe as a database,
// exchange or queue name.
func UniqueName(tb testing.TB, prefix string) string {
	tb.Helper()
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	base := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(tb.Name()), "_"), "_")
	if len(base) > 24 {
		base = base[len(base)-24:]
	}
	return fmt.Sprintf("%s_%s_%s", prefix, base, hex.EncodeToString(b[:]))
}

// Context returns a context cancelled when the test ends or after d.
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// HostPort returns the host:port of rawURL (a server URL such as
// PostgresURL or AMQPURL), failing tb when it has none.
func HostPort(tb testing.TB, rawURL string) string {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Port() == "" {
		tb.Fatalf("%s: no host:port (%v)", rawURL, err)
	}
	return u.Host
}
