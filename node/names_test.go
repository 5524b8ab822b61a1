package node_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
)

// TestSessionsCarryTheNodeName: every PostgreSQL session of a node has
// application_name "ordo node <name>", and (checked with rabbitmqctl, so
// as root only) its broker connection has connection_name "ordo node
// <name>": operators and the nemesis bench find a node's sessions by them.
func TestSessionsCarryTheNodeName(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	ob := testkit.NewOutbox(t, 4, 2)
	dbURL, pool := ob.URL, ob.Pool
	ctx := testkit.Context(t, time.Minute)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	name := "names-" + db[len(db)-10:]
	startNode(t, dbURL, 4, func(c *node.Config) { c.NodeName = name })
	want := "ordo node " + name

	var named, other int
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The test's own pool has no application_name; everything else on
		// the database is the node's.
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE application_name = $2),
			count(*) FILTER (WHERE application_name NOT IN ($2, '') )
			FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db, want).Scan(&named, &other)
		if err != nil {
			t.Fatal(err)
		}
		if named >= 2 { // at least the pool and the lease connection
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions named %q after 30s, want at least 2", named, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if other != 0 {
		t.Fatalf("%d sessions with another application_name", other)
	}
	t.Logf("%d sessions named %q", named, want)

	if os.Getuid() != 0 {
		t.Log("not root: the broker connection's name is not checked (rabbitmqctl)")
		return
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		if n := connectionsNamed(t, want); n == 1 {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%d broker connections named %q after 30s, want 1", n, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// connectionsNamed counts the broker's connections whose connection_name
// client property is name.
func connectionsNamed(t *testing.T, name string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "client_properties", "--formatter", "json").Output()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v", err)
	}
	// A connection still in its handshake lists its properties as the
	// string "none", not as a list: it is not the node's (yet).
	var conns []struct {
		ClientProperties json.RawMessage `json:"client_properties"`
	}
	if err := json.Unmarshal(out, &conns); err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	n := 0
	for _, c := range conns {
		var props [][]any
		if json.Unmarshal(c.ClientProperties, &props) != nil {
			continue
		}
		for _, p := range props {
			if len(p) == 3 && p[0] == "connection_name" && p[2] == name {
				n++
			}
		}
	}
	return n
}
