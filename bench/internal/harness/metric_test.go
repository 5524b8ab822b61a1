package harness

import (
	"strings"
	"testing"
)

func TestSumSamples(t *testing.T) {
	page := `# HELP ordo_relay_read_rows_total Rows read.
# TYPE ordo_relay_read_rows_total counter
ordo_relay_read_rows_total{source="default"} 120
ordo_relay_read_rows_total{source="billing"} 3.5
ordo_relay_read_rows_totally 1000
ordo_relay_reads_total{source="default"} 7
`
	got, found, err := sumSamples(strings.NewReader(page), "ordo_relay_read_rows_total")
	if err != nil || !found || got != 123.5 {
		t.Fatalf("sum = %v, %v, %v; want 123.5, true, nil", got, found, err)
	}
	if _, found, err := sumSamples(strings.NewReader(page), "ordo_absent"); err != nil || found {
		t.Fatalf("absent metric: found %v, err %v", found, err)
	}
	if _, _, err := sumSamples(strings.NewReader("ordo_x{a=\"b\"} notanumber\n"), "ordo_x"); err == nil {
		t.Fatal("a value that is not a number was summed")
	}
}
