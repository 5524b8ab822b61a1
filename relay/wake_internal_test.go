package relay

import (
	"testing"
	"time"
)

// TestRefusedArmPollsSoon: after an arm that a producer's open
// transaction refused, the unarmed partitions are polled (and the arm
// tried again) pollMin later, doubling with each refusal in a row, never
// later than half the time since the last new row; once an arm succeeds
// the gap is that half again.
func TestRefusedArmPollsSoon(t *testing.T) {
	r, err := New(Config{Node: "t", PollInterval: time.Minute}, nil, nil, allLeases{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wake.lastNew, r.wake.lastPoll = now.Add(-2*time.Second), now
	for _, tc := range []struct {
		refused int
		want    time.Duration
	}{
		{0, time.Second},
		{1, pollMin},
		{2, 2 * pollMin},
		{4, 8 * pollMin},
		{10, time.Second},
		{100, time.Second},
	} {
		r.wake.refused = tc.refused
		if got := r.pollGapLocked(); got != tc.want {
			t.Errorf("%d refused arms in a row, the last new row 2 s ago: poll gap %v, want %v", tc.refused, got, tc.want)
		}
	}
}
