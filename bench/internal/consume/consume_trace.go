package consume

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// stmtCounter is a pgx tracer that counts the statements an inbox
// instance sends and the round trips they take: a statement on its own
// (Query, Exec, QueryRow, and the BEGIN and COMMIT of a transaction) is
// one round trip; a batch is one round trip for all its statements.
// Everything the instance sends counts: the handler's statements, lease
// renewals, retry polls and gauges too. It also counts the COMMITs: one
// per transaction, so per handled message it says how many messages
// share a commit (group commit). Safe for concurrent use.
type stmtCounter struct {
	statements, roundTrips, commits atomic.Int64
}

var (
	_ pgx.QueryTracer = (*stmtCounter)(nil)
	_ pgx.BatchTracer = (*stmtCounter)(nil)
)

// batchKey marks a context inside a batch: its queries are traced by
// TraceBatchQuery, not TraceQueryStart.
type batchKey struct{}

func (s *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if ctx.Value(batchKey{}) == nil {
		s.statements.Add(1)
		s.roundTrips.Add(1)
	}
	if strings.EqualFold(d.SQL, "commit") {
		s.commits.Add(1)
	}
	return ctx
}

func (s *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.roundTrips.Add(1)
	return context.WithValue(ctx, batchKey{}, true)
}

func (s *stmtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.statements.Add(1)
}

func (s *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// counts returns the statements, round trips and commits so far.
func (s *stmtCounter) counts() (statements, roundTrips, commits int64) {
	return s.statements.Load(), s.roundTrips.Load(), s.commits.Load()
}
