package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestHTTPMetricsAndReadiness: with -http-addr, shipping serves /metrics
// with the inbox's families, /healthz, and /readyz: ready, then degraded
// (still ready) once a poison order is dead-lettered and holds its key.
func TestHTTPMetricsAndReadiness(t *testing.T) {
	e := newEnv(t)
	addr := testkit.FreeAddr(t)
	e.start("a", "-http-addr", addr, "-max-attempts", "1", "-fault-poison-prefix", "poison")
	want := e.publishAll(4, 2)
	e.waitAll(want)
	base := "http://" + addr
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	if code, body := get(t, base+"/admin/dead"); code != http.StatusForbidden {
		t.Fatalf("/admin/dead without -admin-token: %d %s, want 403", code, body)
	}
	var rd readiness
	if code, body := get(t, base+"/readyz"); code != http.StatusOK || json.Unmarshal([]byte(body), &rd) != nil || !rd.Ready || rd.Degraded {
		t.Fatalf("/readyz before the poison order: %d %s", code, body)
	}
	_, metrics := get(t, base+"/metrics")
	for _, line := range []string{
		fmt.Sprintf(`ordo_inbox_handled_total{consumer="%s"} 8`, e.name),
		fmt.Sprintf(`ordo_inbox_shards_owned{consumer="%s"} %d`, e.name, testShards),
		fmt.Sprintf(`ordo_inbox_handler_duration_seconds_count{consumer="%s"} 8`, e.name),
		fmt.Sprintf(`ordo_inbox_lag_seconds_count{consumer="%s"} 8`, e.name),
	} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	e.pub.Publish("poison-1", 1, "test.v1", []byte(`{}`))
	testkit.WaitFor(t, 30*time.Second, "/readyz degraded", func() bool {
		code, body := get(t, base+"/readyz")
		return code == http.StatusOK && json.Unmarshal([]byte(body), &rd) == nil && rd.Ready && rd.Degraded && rd.DeadKeys == 1
	})
}

func get(tb testing.TB, url string) (int, string) {
	tb.Helper()
	return admin(tb, http.MethodGet, url, "", "")
}
