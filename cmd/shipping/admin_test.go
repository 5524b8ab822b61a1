package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/wire"
)

const testToken = "test-admin-token"

// admin sends an admin request with token (none when empty) as operator,
// and returns the status and body.
func admin(tb testing.TB, method, url, token, operator string) (int, string) {
	tb.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if operator != "" {
		req.Header.Set(operatorHeader, operator)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// adminList GETs an admin listing into out, failing unless it is 200.
func adminList(tb testing.TB, url string, out any) {
	tb.Helper()
	code, body := admin(tb, http.MethodGet, url, testToken, "")
	if code != http.StatusOK {
		tb.Fatalf("GET %s: %d %s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), out); err != nil {
		tb.Fatalf("GET %s: %v in %s", url, err, body)
	}
}

func deadAt(tb testing.TB, base, key string) int64 {
	var dead []inbox.DeadMessage
	adminList(tb, base+"/admin/dead", &dead)
	for _, d := range dead {
		if d.Key == key {
			return d.KeySeq
		}
	}
	return 0
}

// TestAdminHTTPToken: the admin API refuses every request without the
// right bearer token, and answers with it.
func TestAdminHTTPToken(t *testing.T) {
	e := newEnv(t)
	addr := testkit.FreeAddr(t)
	e.start("a", "-http-addr", addr, "-admin-token", testToken)
	base := "http://" + addr
	for _, tc := range []struct {
		name, method, path, token string
		want                      int
	}{
		{"no token", http.MethodGet, "/admin/dead", "", http.StatusUnauthorized},
		{"wrong token", http.MethodGet, "/admin/dead", "nope", http.StatusUnauthorized},
		{"token a prefix of the right one", http.MethodGet, "/admin/dead", testToken[:4], http.StatusUnauthorized},
		{"wrong token, action", http.MethodPost, "/admin/keys/k1/retry", "nope", http.StatusUnauthorized},
		{"right token, dead", http.MethodGet, "/admin/dead", testToken, http.StatusOK},
		{"right token, stuck", http.MethodGet, "/admin/stuck", testToken, http.StatusOK},
		{"right token, audit", http.MethodGet, "/admin/audit", testToken, http.StatusOK},
		{"right token, bad limit", http.MethodGet, "/admin/audit?limit=0", testToken, http.StatusBadRequest},
		{"right token, unknown action", http.MethodPost, "/admin/keys/k1/explode", testToken, http.StatusNotFound},
		{"right token, nothing to retry", http.MethodPost, "/admin/keys/k1/retry", testToken, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := admin(t, tc.method, base+tc.path, tc.token, "tester"); code != tc.want {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
			}
		})
	}
	// Only the authorized action was recorded (refused, nothing to retry).
	var audit []inbox.AuditEntry
	adminList(t, base+"/admin/audit", &audit)
	if len(audit) != 1 || audit[0].Action != inbox.ActionRetry || audit[0].Key != "k1" || audit[0].Operator != "tester" ||
		!strings.HasPrefix(audit[0].Result, "error: ") {
		t.Fatalf("audit %+v, want the one refused retry of k1 by tester", audit)
	}
}

// TestAdminHTTPActions: over HTTP an operator sees a stuck key and
// resolves it, sees dead letters, skips one (its key goes on) and retries
// one after the handler is fixed (a new instance without the poison
// fault), which really handles the dead message and the one held behind
// it. Every action is in the audit, refused ones included, with its
// operator and address; a CLI action too.
func TestAdminHTTPActions(t *testing.T) {
	e := newEnv(t)
	addr := testkit.FreeAddr(t)
	a := e.start("a", "-http-addr", addr, "-admin-token", testToken, "-max-attempts", "1",
		"-fault-poison-prefix", "poison", "-gap-wait", "500ms")
	base := "http://" + addr

	// A stuck key: gap-1's key_seq 2 arrives, 1 never does.
	e.pub.Publish("gap-1", 2, "test.v1", []byte(`{}`))
	testkit.WaitFor(t, 30*time.Second, "gap-1 listed stuck", func() bool {
		var stuck []inbox.StuckKey
		adminList(t, base+"/admin/stuck", &stuck)
		return len(stuck) == 1 && stuck[0].Key == "gap-1" && stuck[0].Last == 0 && stuck[0].Prev == 1
	})
	resolveOtherSources(t, base, "gap-1")
	if code, body := admin(t, http.MethodPost, base+"/admin/keys/gap-1/resolve", testToken, "alice"); code != http.StatusOK {
		t.Fatalf("resolve gap-1: %d %s", code, body)
	}
	testkit.WaitFor(t, 30*time.Second, "gap-1's key_seq 2 handled", func() bool {
		seqs, _ := e.events()
		return len(seqs["gap-1"]) == 1 && seqs["gap-1"][0] == 2
	})
	if code, body := admin(t, http.MethodPost, base+"/admin/keys/gap-1/resolve", testToken, "alice"); code != http.StatusConflict {
		t.Fatalf("second resolve of gap-1: %d %s, want 409", code, body)
	}

	// Two poison orders, two events each: each first event is dead and
	// holds the second.
	for _, k := range []string{"poison-1", "poison-2"} {
		e.pub.Publish(k, 1, "test.v1", []byte(`{}`))
		e.pub.Publish(k, 2, "test.v1", []byte(`{}`))
	}
	testkit.WaitFor(t, 30*time.Second, "both poison orders dead at key_seq 1", func() bool {
		return deadAt(t, base, "poison-1") == 1 && deadAt(t, base, "poison-2") == 1
	})
	// Skip poison-2's first event: its second is handled next, and (still
	// poison here) dead-lettered in turn.
	if code, body := admin(t, http.MethodPost, base+"/admin/keys/poison-2/skip", testToken, "bob"); code != http.StatusOK {
		t.Fatalf("skip poison-2: %d %s", code, body)
	}
	testkit.WaitFor(t, 30*time.Second, "poison-2 dead at key_seq 2", func() bool { return deadAt(t, base, "poison-2") == 2 })

	// The handler is fixed: a replaces its binary by one without the
	// fault. A retry re-handles poison-1's dead event and the one behind.
	stopped(t, a, "handled")
	addrB := testkit.FreeAddr(t)
	e.start("b", "-http-addr", addrB, "-admin-token", testToken, "-max-attempts", "1", "-gap-wait", "500ms")
	baseB := "http://" + addrB
	if code, body := admin(t, http.MethodPost, baseB+"/admin/keys/poison-1/retry", testToken, "carol"); code != http.StatusOK {
		t.Fatalf("retry poison-1: %d %s", code, body)
	}
	testkit.WaitFor(t, 30*time.Second, "poison-1 handled 1, 2 after the retry", func() bool {
		seqs, _ := e.events()
		return fmt.Sprint(seqs["poison-1"]) == "[1 2]"
	})
	if s := deadAt(t, baseB, "poison-1"); s != 0 {
		t.Fatalf("poison-1 still dead at key_seq %d after its retry", s)
	}

	// The CLI's actions go to the same audit.
	cli := exec.Command(e.bin, "-postgres-url", e.dbURL, "-name", e.name, "-shards", strconv.Itoa(testShards),
		"-partitions", strconv.Itoa(testPartitions), "-operator", "dave", "retry", "poison-2")
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("shipping retry poison-2: %v\n%s", err, out)
	}

	cli = exec.Command(e.bin, "-postgres-url", e.dbURL, "-name", e.name, "-shards", strconv.Itoa(testShards),
		"-partitions", strconv.Itoa(testPartitions), "audit")
	if out, err := cli.CombinedOutput(); err != nil || !regexp.MustCompile(`(?m)^\S+\s+dave\s+cli\s+retry\s+default\s+poison-2\s+done$`).Match(out) {
		t.Fatalf("shipping audit: %v\n%s", err, out)
	}
	last := auditTrail(t, baseB, []string{"alice resolve billing/gap-1 error", "alice resolve gap-1 done", "alice resolve gap-1 error", "bob skip poison-2 done",
		"carol retry poison-1 done", "dave retry poison-2 done"})
	if last.RemoteAddr != "cli" {
		t.Fatalf("the CLI's action is recorded from %q, want cli", last.RemoteAddr)
	}
}

// resolveOtherSources checks that the key actions name the source: key is
// stuck in the default source only, so resolving billing's key finds
// nothing (recorded as refused by alice), and an invalid source name is
// refused before anything is done (not recorded).
func resolveOtherSources(tb testing.TB, base, key string) {
	tb.Helper()
	if code, body := admin(tb, http.MethodPost, base+"/admin/keys/"+key+"/resolve?source=billing", testToken, "alice"); code != http.StatusConflict {
		tb.Fatalf("resolve billing's %s: %d %s, want 409 (only default's is stuck)", key, code, body)
	}
	if code, body := admin(tb, http.MethodPost, base+"/admin/keys/"+key+"/resolve?source=Billing", testToken, "alice"); code != http.StatusBadRequest {
		tb.Fatalf("resolve with source Billing: %d %s, want 400", code, body)
	}
}

// auditTrail checks the audit, oldest first, as "operator action key
// done|error" lines against want (a key of a source other than default
// as source/key), and that each entry has an address; it returns the
// newest entry.
func auditTrail(tb testing.TB, base string, want []string) inbox.AuditEntry {
	tb.Helper()
	var audit []inbox.AuditEntry
	adminList(tb, base+"/admin/audit", &audit)
	var got []string
	for i := len(audit) - 1; i >= 0; i-- {
		x := audit[i]
		if x.RemoteAddr == "" {
			tb.Errorf("audit entry %+v has no address", x)
		}
		res := x.Result
		if strings.HasPrefix(res, "error: ") {
			res = "error"
		}
		key := x.Key
		if x.Source != wire.DefaultSource {
			key = x.Source + "/" + key
		}
		got = append(got, fmt.Sprintf("%s %s %s %s", x.Operator, x.Action, key, res))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		tb.Fatalf("audit, oldest first:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	return audit[0]
}
