package outbox_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// TestNotifyChannelIsTheTriggers: the trigger functions the migrations
// install notify on outbox.NotifyChannel, the channel relays LISTEN on and
// operators' actions notify (the SQL cannot import the Go constant).
// TestNotifyPerPartition checks the same by listening.
func TestNotifyChannelIsTheTriggers(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 1)
	ctx := testkit.Context(t, 30*time.Second)
	rows, err := pool.Query(ctx, `
SELECT p.proname, p.prosrc FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.prosrc LIKE '%pg_notify%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	calls := regexp.MustCompile(`pg_notify\s*\(`)
	literal := regexp.MustCompile(`pg_notify\s*\(\s*'([^']*)'`)
	var funcs, notifies int
	for rows.Next() {
		var name, src string
		if err := rows.Scan(&name, &src); err != nil {
			t.Fatal(err)
		}
		funcs++
		all, lits := calls.FindAllStringIndex(src, -1), literal.FindAllStringSubmatch(src, -1)
		if len(lits) != len(all) {
			t.Errorf("%s: %d pg_notify calls, %d with a literal channel: cannot check them", name, len(all), len(lits))
		}
		for _, m := range lits {
			notifies++
			if m[1] != outbox.NotifyChannel {
				t.Errorf("%s notifies channel %q, outbox.NotifyChannel is %q", name, m[1], outbox.NotifyChannel)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if funcs == 0 || notifies == 0 {
		t.Fatalf("found %d functions and %d pg_notify calls: the notify trigger is missing", funcs, notifies)
	}
	t.Logf("%d function(s), %d pg_notify call(s), all on %q", funcs, notifies, outbox.NotifyChannel)
}
