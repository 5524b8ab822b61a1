package main

import (
	"bytes"
	stdctx "context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
)

func runAdmin(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	code := exitStatus(cli{lookup: lookup, stdout: &out, stderr: &errOut}.run(stdctx.Background(), args), &errOut)
	return code, out.String(), errOut.String()
}

// TestAdminEndToEnd drives the operator subcommands against a real node
// process: a message with no binding is parked; parked lists it; bad
// arguments and tokens get clear errors; skip releases it.
func TestAdminEndToEnd(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lonely := testkit.NewExchange(t) // nothing bound: every message is returned
	ids := f.enqueueTo(t, lonely, "stuck", "nowhere.bound", 2)
	_, base := f.start(t, "admin-node", "ORDO_ADMIN_TOKEN=s3cret", "ORDO_RETRY_MIN=10ms", "ORDO_RETRY_MAX=50ms")
	addr := strings.TrimPrefix(base, "http://")
	env := map[string]string{"ORDO_ADMIN_TOKEN": "s3cret"}

	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, _ := runAdmin(t, env, "parked", "-http", addr)
		if code == 0 && strings.Contains(out, ids[0].String()) {
			if !strings.Contains(out, "NO_ROUTE") || !strings.Contains(out, "stuck") {
				t.Fatalf("parked listing lacks the error or key:\n%s", out)
			}
			t.Logf("parked:\n%s", out)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("message never parked (exit %d):\n%s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	ghost := uuid.NewString()
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		msg  string
	}{
		{"no token", nil, []string{"parked", "-http", addr}, 1, "missing bearer token"},
		{"wrong token", map[string]string{"ORDO_ADMIN_TOKEN": "nope"}, []string{"parked", "-http", addr}, 1, "wrong admin token"},
		{"malformed id", env, []string{"skip", "-http", addr, "not-a-uuid"}, 1, "malformed message id"},
		{"unknown id", env, []string{"skip", "-http", addr, ghost}, 1, "no such message"},
		{"not parked", env, []string{"retry", "-http", addr, ids[1].String()}, 1, "not parked"},
		{"unknown key", env, []string{"retry", "-http", addr, "-key", "ghost"}, 1, "no parked message for key"},
		{"no id", env, []string{"skip", "-http", addr}, 2, "exactly one message id"},
		{"stray args", env, []string{"purge", "-http", addr, "x"}, 2, "unexpected arguments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := runAdmin(t, c.env, c.args...)
			if code != c.code || !strings.Contains(errOut, c.msg) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut, c.code, c.msg)
			}
		})
	}

	code, out, errOut := runAdmin(t, env, "skip", "-http", addr, "-operator", "alice", ids[0].String())
	if code != 0 {
		t.Fatalf("skip: exit %d %s", code, errOut)
	}
	t.Logf("skip: %s", out)
	ctx := ctx30(t)
	var op, action, remote string
	if err := f.pool.QueryRow(ctx, `SELECT operator, action, remote_addr FROM ordo_operator_audit
		WHERE result = 'skipped'`).Scan(&op, &action, &remote); err != nil {
		t.Fatal(err)
	}
	if op != "alice" || action != "skip" || !strings.HasPrefix(remote, "127.0.0.1:") {
		t.Fatalf("audit: operator %q action %q from %q", op, action, remote)
	}
	// Refusals that reached an action are audited, in order; those refused
	// before (authentication, a malformed id, bad arguments) are not.
	rows, err := f.pool.Query(ctx, `SELECT action, target, result FROM ordo_operator_audit
		WHERE result LIKE 'error:%' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	for rows.Next() {
		var action, target, result string
		if err := rows.Scan(&action, &target, &result); err != nil {
			t.Fatal(err)
		}
		refused = append(refused, action+" | "+target+" | "+result)
	}
	rows.Close()
	want := []string{
		"skip | message " + ghost + " | error: no such message: " + ghost,
		"retry | message " + ids[1].String() + " | error: message is not parked: " + ids[1].String(),
		`retry-key | key ghost | error: no such message: no parked message for key "ghost"`,
	}
	if !slices.Equal(refused, want) {
		t.Fatalf("refused actions audited:\n  %s\nwant:\n  %s", strings.Join(refused, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestAdminOffWithoutToken: with no token configured, the actions are off
// and the answer says so.
func TestAdminOffWithoutToken(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, base := f.start(t, "no-admin-node")
	code, _, errOut := runAdmin(t, map[string]string{"ORDO_ADMIN_TOKEN": "anything"}, "parked", "-http", strings.TrimPrefix(base, "http://"))
	if code != 1 || !strings.Contains(errOut, "admin actions are off") || !strings.Contains(errOut, "ORDO_ADMIN_TOKEN") {
		t.Fatalf("exit %d, %q", code, errOut)
	}
}

// TestGossipKeyCommand rotates a running node's gossip key through the CLI.
func TestGossipKeyCommand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	keyA := "YWFhYWFhYWFhYWFhYWFhYQ==" // "aaaaaaaaaaaaaaaa"
	keyB := "YmJiYmJiYmJiYmJiYmJiYg==" // "bbbbbbbbbbbbbbbb"
	_, base := f.start(t, "keys-node", "ORDO_ADMIN_TOKEN=t0k", "ORDO_GOSSIP_ADDR="+testkit.FreeAddr(t), "ORDO_GOSSIP_KEY="+keyA)
	addr := strings.TrimPrefix(base, "http://")
	env := map[string]string{"ORDO_ADMIN_TOKEN": "t0k"}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"use before add", []string{"use", keyB}, 1, "add the key"},
		{"add", []string{"add", keyB}, 0, `"keys": 2`},
		{"remove the key in use", []string{"remove", keyA}, 1, "cannot be removed"},
		{"use", []string{"use", keyB}, 0, `"keys": 2`},
		{"remove", []string{"remove", keyA}, 0, `"keys": 1`},
		{"bad key", []string{"add", "not base64!"}, 1, "key:"},
		{"bad action", []string{"rotate", keyB}, 1, "unknown action"},
		{"missing key", []string{"add"}, 2, "want an action"},
	} {
		args := append([]string{"gossip-key", "-http", addr}, c.args...)
		code, out, errOut := runAdmin(t, env, args...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Fatalf("%s: exit %d, out %q, err %q; want %d and %q", c.name, code, out, errOut, c.code, c.want)
		}
	}
}

// TestFillGapEndToEnd: a key whose head is parked has a row behind it
// deleted by hand, which leaves a key_seq gap. node parked lists the gap;
// node fill-gap puts a dead placeholder in it; once the head is skipped,
// the message after the gap is published with an x-ordo-prev-key-seq that
// steps over both, instead of naming a message that never existed.
func TestFillGapEndToEnd(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex, "ok.*")
	head := f.enqueueTo(t, ex, "holey", "nowhere.bound", 1)[0] // returned: parked
	behind := f.enqueueTo(t, ex, "holey", "ok.placed", 2)      // key_seq 2 and 3
	_, base := f.start(t, "gap-node", "ORDO_ADMIN_TOKEN=s3cret", "ORDO_RETRY_MIN=10ms", "ORDO_RETRY_MAX=50ms")
	addr := strings.TrimPrefix(base, "http://")
	env := map[string]string{"ORDO_ADMIN_TOKEN": "s3cret"}

	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, _ := runAdmin(t, env, "parked", "-http", addr)
		if code == 0 && strings.Contains(out, head.String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("head never parked (exit %d):\n%s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := f.pool.Exec(ctx30(t), `DELETE FROM outbox WHERE id = $1`, behind[0]); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runAdmin(t, env, "parked", "-http", addr)
	if code != 0 || !strings.Contains(out, "1 key_seq gap(s)") || !regexp.MustCompile(`holey\s+2\s+\d+\s+3`).MatchString(out) {
		t.Fatalf("node parked does not show the gap (exit %d, %s):\n%s", code, errOut, out)
	}
	t.Logf("parked:\n%s", out)
	if code, _, errOut := runAdmin(t, env, "fill-gap", "-http", addr, "holey", "3"); code != 1 || !strings.Contains(errOut, "not a key_seq gap") {
		t.Fatalf("fill-gap of a row: exit %d %q, want 1 and a refusal", code, errOut)
	}
	if code, out, errOut := runAdmin(t, env, "fill-gap", "-http", addr, "-operator", "bob", "holey", "2"); code != 0 || !strings.Contains(out, "placeholder") {
		t.Fatalf("fill-gap: exit %d %s %s", code, out, errOut)
	}
	if code, out, _ := runAdmin(t, env, "parked", "-http", addr); code != 0 || !strings.Contains(out, "no key_seq gaps") {
		t.Fatalf("a gap is still listed after filling it:\n%s", out)
	}
	if code, _, errOut := runAdmin(t, env, "skip", "-http", addr, head.String()); code != 0 {
		t.Fatalf("skip: %s", errOut)
	}
	checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Distinct >= 1 })
	d := checker.Deliveries()[0]
	if d.MessageID != behind[1].String() || d.KeySeq != 3 || !d.HasPrevKeySeq || d.PrevKeySeq != 0 {
		t.Fatalf("delivery %s key_seq %d prev %d (%v); want %s, 3, prev 0 (1 skipped, 2 filled)",
			d.MessageID, d.KeySeq, d.PrevKeySeq, d.HasPrevKeySeq, behind[1])
	}
}

// TestBulkRetry: node retry -error and -key-prefix retry every parked
// message they select, and only those.
func TestBulkRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lonely := testkit.NewExchange(t)
	for _, key := range []string{"bulk-a1", "bulk-a2", "other"} {
		f.enqueueTo(t, lonely, key, "nowhere.bound", 1)
	}
	_, base := f.start(t, "bulk-node", "ORDO_ADMIN_TOKEN=s3cret", "ORDO_MAX_ATTEMPTS=1", "ORDO_RETRY_MIN=10ms", "ORDO_RETRY_MAX=50ms")
	addr := strings.TrimPrefix(base, "http://")
	env := map[string]string{"ORDO_ADMIN_TOKEN": "s3cret"}
	f.ob.WaitParked(t, 3, 30*time.Second)

	if code, _, errOut := runAdmin(t, env, "retry", "-http", addr, "-key", "x", "-error", "NO_ROUTE"); code != 2 {
		t.Errorf("-key with -error: exit %d (%s), want 2", code, errOut)
	}
	code, out, errOut := runAdmin(t, env, "retry", "-http", addr, "-error", "NO_ROUTE", "-key-prefix", "bulk-a")
	if code != 0 || !strings.Contains(out, `"retried": 2`) {
		t.Fatalf("bulk retry: exit %d, out %q, err %q; want 2 retried", code, out, errOut)
	}
	code, out, _ = runAdmin(t, env, "retry", "-http", addr, "-error", "no such error anywhere")
	if code != 0 || !strings.Contains(out, `"retried": 0`) {
		t.Fatalf("bulk retry matching nothing: exit %d, out %q", code, out)
	}
	var result string
	if err := f.pool.QueryRow(ctx30(t), `SELECT result FROM ordo_operator_audit WHERE action = 'retry-bulk' ORDER BY id LIMIT 1`).Scan(&result); err != nil || result != "retried 2" {
		t.Fatalf("audit of the bulk retry: %q (%v)", result, err)
	}
}
