package measure

import (
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
)

func TestBackendGroups(t *testing.T) {
	before := map[int]BackendCPUNow{1: {GroupBench, time.Second}, 2: {GroupRelay, 2 * time.Second}}
	after := map[int]BackendCPUNow{
		1: {GroupBench, 1500 * time.Millisecond},
		2: {GroupRelay, 2100 * time.Millisecond},
		3: {GroupRelay, 50 * time.Millisecond}, // new since before: counts whole
		4: {GroupProbe, time.Second},
	}
	d := GroupDelta(before, after)
	if d[GroupBench] != 500*time.Millisecond || d[GroupRelay] != 150*time.Millisecond || d[GroupProbe] != time.Second {
		t.Fatalf("delta = %v", d)
	}
	for app, want := range map[string]string{harness.AppBench: GroupBench, harness.AppProbe: GroupProbe, AppClassic: GroupRelay, "": GroupRelay} {
		if got := BackendGroup(app); got != want {
			t.Errorf("backendGroup(%q) = %s, want %s", app, got, want)
		}
	}
	if got := PerMsgMicros(3*time.Millisecond, 1000); got != 3 {
		t.Errorf("perMsgMicros = %v, want 3", got)
	}
}
