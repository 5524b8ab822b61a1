package relay_test

import (
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// TestCoreReadAheadFullReadsEachRowAboutOnce: a backlog of a few hot keys
// larger than the read-ahead is read about once, not once per pass: a
// pass that leaves rows out for memory resumes below the first of them,
// rather than reading on to the end and starting over from the first
// pending row (121,682 rows read for 20,000 in the 10-hot-key drain at
// 16 MiB, issue 23).
func TestCoreReadAheadFullReadsEachRowAboutOnce(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, func(cfg *relay.Config) {
		cfg.ReadAheadBytes = 40 << 10 // about 80 rows
		cfg.BatchSize = 64
	})
	ids := c.insert(10, 200)
	c.start()
	start := time.Now()
	testkit.WaitFor(t, time.Minute, "every row marked", func() bool { return c.store.Pending() == 0 })
	st := c.r.Stats()
	t.Logf("drained in %v", time.Since(start))
	t.Logf("%d rows read for %d rows, in %d reads (%d passes)", st.ReadRows, len(ids), st.Reads, st.Passes)
	if st.ReadRows > 2*int64(len(ids)) {
		t.Fatalf("%d rows read for %d: a backlog over the read-ahead is read again and again", st.ReadRows, len(ids))
	}
}
