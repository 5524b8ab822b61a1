package composecheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestComposeNamesExist checks that what docker-compose.yml names exists:
// every service in a depends_on, every file it mounts from this
// repository, and that every service but one-shot jobs has a healthcheck.
func TestComposeNamesExist(t *testing.T) {
	svcs, err := scanCompose(strings.NewReader(repoFile(t, "docker-compose.yml")))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	names := map[string]bool{}
	for _, s := range svcs {
		names[s.Name] = true
	}
	for _, want := range []string{"postgres", "rabbitmq", "node1", "node2", "node3", "orderapi", "prometheus", "grafana", "jaeger"} {
		if !names[want] {
			t.Errorf("no service %s", want)
		}
	}
	depKey := regexp.MustCompile(`^([A-Za-z0-9_-]+):$`)
	mount := regexp.MustCompile(`^- \./([^:\s"]+):`)
	mounted := 0
	for _, s := range svcs {
		for _, line := range strings.Split(s.Props["depends_on"], "\n") {
			if m := depKey.FindStringSubmatch(line); m != nil && !names[m[1]] {
				t.Errorf("service %s depends on %s, which is not a service", s.Name, m[1])
			}
		}
		for _, line := range strings.Split(s.Props["volumes"], "\n") {
			if m := mount.FindStringSubmatch(line); m != nil {
				mounted++
				if _, err := os.Stat(filepath.Join("..", "..", m[1])); err != nil {
					t.Errorf("service %s mounts ./%s: %v", s.Name, m[1], err)
				}
			}
		}
		if _, ok := s.Props["healthcheck"]; !ok && s.Props["restart"] != `"no"` {
			t.Errorf("service %s has no healthcheck", s.Name)
		}
	}
	if mounted < 5 {
		t.Errorf("found %d mounts of repository files; the scanner is probably broken", mounted)
	}
}

// TestDeployMetricsExist checks that every ordo_ metric the alerts and the
// dashboard use is one docs/operations.md lists (TestMetricsDocumented in
// cmd/node checks the list against what a node exports), and that the
// dashboard's datasource is the one provisioning declares.
func TestDeployMetricsExist(t *testing.T) {
	doc := repoFile(t, "docs/operations.md")
	name := regexp.MustCompile(`\bordo_[a-z0-9_]+`)
	documented := name.FindAllString(doc, -1)
	for _, f := range []string{"deploy/prometheus/alerts.yml", "deploy/grafana/ordo.json"} {
		for _, m := range name.FindAllString(repoFile(t, f), -1) {
			m = strings.TrimSuffix(m, "_bucket")
			if !slices.Contains(documented, m) {
				t.Errorf("%s uses %s, which docs/operations.md does not list", f, m)
			}
		}
	}

	uid := regexp.MustCompile(`(?m)^\s+uid:\s*(\S+)`).FindStringSubmatch(repoFile(t, "deploy/grafana/provisioning/datasources/prometheus.yml"))
	if uid == nil {
		t.Fatal("the datasource provisioning declares no uid")
	}
	var dash struct {
		Panels []struct {
			Title      string
			Datasource struct{ UID string }
			Targets    []struct {
				Expr       string
				Datasource struct{ UID string }
			}
		}
	}
	if err := json.Unmarshal([]byte(repoFile(t, "deploy/grafana/ordo.json")), &dash); err != nil {
		t.Fatalf("deploy/grafana/ordo.json: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	for _, p := range dash.Panels {
		if p.Datasource.UID != uid[1] {
			t.Errorf("panel %q uses datasource %q, want %q", p.Title, p.Datasource.UID, uid[1])
		}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != uid[1] || tg.Expr == "" {
				t.Errorf("panel %q: a target with datasource %q and expr %q", p.Title, tg.Datasource.UID, tg.Expr)
			}
		}
	}
}

// TestPrometheusScrapesCompose checks that every target of
// deploy/prometheus/prometheus.yml is a compose service serving HTTP on
// that port (its ORDO_HTTP_ADDR), and that every service with an
// ORDO_HTTP_ADDR is scraped: an instance added to compose without a
// scrape target would be invisible to the alerts.
func TestPrometheusScrapesCompose(t *testing.T) {
	svcs, err := scanCompose(strings.NewReader(repoFile(t, "docker-compose.yml")))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	httpAddr := regexp.MustCompile(`(?m)^ORDO_HTTP_ADDR:\s*"?[^"\s]*:(\d+)"?$`)
	serving := map[string]string{} // service -> port
	for _, s := range svcs {
		if m := httpAddr.FindStringSubmatch(s.Props["environment"]); m != nil {
			serving[s.Name] = m[1]
		}
	}
	target := regexp.MustCompile(`"([a-z0-9-]+):(\d+)"`)
	scraped := map[string]bool{}
	for _, m := range target.FindAllStringSubmatch(repoFile(t, "deploy/prometheus/prometheus.yml"), -1) {
		scraped[m[1]] = true
		if port, ok := serving[m[1]]; !ok || port != m[2] {
			t.Errorf("prometheus.yml scrapes %s:%s, but compose's %s serves HTTP on port %q", m[1], m[2], m[1], port)
		}
	}
	for name := range serving {
		if !scraped[name] {
			t.Errorf("compose's %s serves HTTP (ORDO_HTTP_ADDR) but prometheus.yml does not scrape it", name)
		}
	}
	if len(scraped) < 7 {
		t.Errorf("found %d scrape targets; the pattern is probably broken", len(scraped))
	}
}

// TestDashboardConsumerRow checks that the dashboard has a consumer row
// querying every inbox family an operator watches, and that
// no two panels overlap (a panel added at a taken position hides another).
func TestDashboardConsumerRow(t *testing.T) {
	type grid struct{ X, Y, W, H int }
	var dash struct {
		Panels []struct {
			Type, Title string
			GridPos     grid
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal([]byte(repoFile(t, "deploy/grafana/ordo.json")), &dash); err != nil {
		t.Fatalf("deploy/grafana/ordo.json: %v", err)
	}
	var row bool
	var exprs strings.Builder
	for i, p := range dash.Panels {
		if p.Type == "row" && strings.HasPrefix(p.Title, "Consumer") {
			row = true
		}
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
		for _, q := range dash.Panels[:i] {
			a, b := p.GridPos, q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q %+v and %q %+v overlap", p.Title, a, q.Title, b)
			}
		}
	}
	if !row {
		t.Error("the dashboard has no row titled Consumer…")
	}
	for _, m := range []string{
		"ordo_inbox_handled_total", "ordo_inbox_duplicates_total", "ordo_inbox_retries_total", "ordo_inbox_dead_lettered_total",
		"ordo_inbox_stuck_keys", "ordo_inbox_dead_keys", "ordo_inbox_shards_owned",
		"ordo_inbox_lag_seconds_bucket", "ordo_inbox_handler_duration_seconds_bucket",
	} {
		if !strings.Contains(exprs.String(), m) {
			t.Errorf("no dashboard panel queries %s", m)
		}
	}
}
