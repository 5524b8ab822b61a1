package inbox_test

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ordo-relay/ordo/inbox"
)

// TestMetricsInOperations: every metric the collector exports is in the
// consumer table of docs/operations.md, which the alerts and the
// dashboard are checked against (internal/composecheck).
func TestMetricsInOperations(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	c, err := inbox.New(inbox.Config{Name: "doc", Exchange: "x"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 64)
	c.Collector().Describe(ch)
	close(ch)
	n := 0
	for d := range ch {
		n++
		name := d.String()[strings.Index(d.String(), `fqName: "`)+9:]
		name = name[:strings.Index(name, `"`)]
		if !strings.Contains(string(doc), "| `"+name+"` |") {
			t.Errorf("%s is not a row of docs/operations.md's consumer metrics table", name)
		}
	}
	if n < 13 {
		t.Fatalf("%d metrics described, want at least 13", n)
	}
}
