package opaudit

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a database with an action's table (thing) and an audit
// table, and a pool whose first connection goes through proxy (the
// others go straight to PostgreSQL).
type fixture struct {
	ctx    context.Context
	direct *pgxpool.Pool // straight to PostgreSQL, for the test's own reads
	pool   *pgxpool.Pool // the one Run uses
	proxy  *testkit.Proxy
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	url, direct := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 60*time.Second)
	if _, err := direct.Exec(ctx, `
CREATE TABLE thing (id int PRIMARY KEY, state text NOT NULL);
INSERT INTO thing VALUES (1, 'parked'), (2, 'parked');
CREATE TABLE audit (id bigserial PRIMARY KEY, target int NOT NULL, result text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	f := &fixture{ctx: ctx, direct: direct, proxy: testkit.NewProxy(t, testkit.HostPort(t, url))}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off" // as the node's pool
	var dials atomic.Int32
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			addr = f.proxy.Addr()
		}
		return dial(ctx, network, addr)
	}
	cfg.MaxConns, cfg.MinConns = 2, 0
	if f.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	return f
}

// act runs Run on thing id, recording what it does in audit; action
// fails with fail when it is not nil.
func (f *fixture) act(ctx context.Context, id int, fail error, beforeCommit func()) error {
	return Run(ctx, f.pool, func(tx pgx.Tx) (string, error) {
		if fail != nil {
			return "", fail
		}
		_, err := tx.Exec(ctx, `UPDATE thing SET state = 'retried' WHERE id = $1`, id)
		return "retried", err
	}, func(ctx context.Context, tx pgx.Tx, result string) error {
		var sc string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO audit (target, result) VALUES ($1, $2)`, id, result+" (synchronous_commit="+sc+")")
		return err
	}, beforeCommit)
}

func (f *fixture) audits(t *testing.T, id int) []string {
	t.Helper()
	rows, err := f.direct.Query(f.ctx, `SELECT result FROM audit WHERE target = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (f *fixture) state(t *testing.T, id int) string {
	t.Helper()
	var s string
	if err := f.direct.QueryRow(f.ctx, `SELECT state FROM thing WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRunRecordsEveryOutcome: a done action and its record commit
// together; a refused one rolls back and is recorded as "error"; both
// records commit synchronously although the pool's sessions run with
// synchronous_commit=off (an action reported to an operator must survive
// a database crash).
func TestRunRecordsEveryOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if err := f.act(f.ctx, 1, nil, nil); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused on purpose")
	if err := f.act(f.ctx, 2, refused, nil); !errors.Is(err, refused) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("refused action: %v, want the refusal", err)
	}
	if got := f.audits(t, 1); len(got) != 1 || got[0] != "retried (synchronous_commit=on)" {
		t.Errorf("audit of a done action %q, want [retried (synchronous_commit=on)]", got)
	}
	if got := f.audits(t, 2); len(got) != 1 || !strings.HasPrefix(got[0], "error: refused on purpose") || !strings.HasSuffix(got[0], "(synchronous_commit=on)") {
		t.Errorf("audit of a refused action %q, want [error: refused on purpose ... (synchronous_commit=on)]", got)
	}
	if s := f.state(t, 2); s != "parked" {
		t.Errorf("a refused action left state %q", s)
	}
}

// TestRunCommitOutcome: an action whose COMMIT got no answer may have
// taken effect, so its record must say "unknown", not "error", and Run
// returns ErrOutcomeUnknown; one whose COMMIT was never sent surely did
// not, and says "error". The pool's first connection goes through a
// proxy, which holds back the COMMIT's answer; the records of the
// failures go over a direct one.
func TestRunCommitOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	t.Run("answer lost", func(t *testing.T) {
		ctx, cancel := context.WithCancel(f.ctx)
		defer cancel()
		watcher := make(chan struct{})
		beforeCommit := func() {
			f.proxy.DelayReplies(time.Hour)
			// Give up once the COMMIT has taken effect, as a client whose
			// connection died after sending it.
			go func() {
				defer close(watcher)
				defer cancel()
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for {
					var n int
					err := f.direct.QueryRow(ctx, `SELECT count(*) FROM audit WHERE target = 1`).Scan(&n)
					if err != nil || n > 0 {
						return
					}
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
				}
			}()
		}
		err := f.act(ctx, 1, nil, beforeCommit)
		f.proxy.DelayReplies(0)
		<-watcher
		if !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("Run: %v, want ErrOutcomeUnknown", err)
		}
		got := f.audits(t, 1)
		if len(got) != 2 || !strings.HasPrefix(got[0], "retried") || !strings.HasPrefix(got[1], "unknown: ") {
			t.Fatalf("audit rows %q, want [retried, unknown: ...]", got)
		}
	})
	t.Run("never sent", func(t *testing.T) {
		ctx, cancel := context.WithCancel(f.ctx)
		defer cancel()
		err := f.act(ctx, 2, nil, cancel)
		if err == nil || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("Run: %v, want a plain failure", err)
		}
		if got := f.audits(t, 2); len(got) != 1 || !strings.HasPrefix(got[0], "error: ") {
			t.Fatalf("audit rows %q, want [error: ...]", got)
		}
		if s := f.state(t, 2); s != "parked" {
			t.Fatalf("state %q: the action whose COMMIT was never sent took effect", s)
		}
	})
}
