package lease

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/relay"
)

// The Leaser's statements one at a time, for tests that drive them
// without Run (TestLeaseRowsLockedInOneOrder).

// RenewNow runs one renewal of every held lease on conn, as Run does every
// RenewEvery.
func (l *Leaser) RenewNow(ctx context.Context, conn *pgx.Conn) error { return l.renew(ctx, conn) }

// ClaimNow claims parts on conn, as Run does for the wanted partitions it
// does not hold, and returns how many it got.
func (l *Leaser) ClaimNow(ctx context.Context, conn *pgx.Conn, parts []int32) (int, error) {
	return l.claim(ctx, conn, parts)
}

// ReleaseNow releases leases on conn, in the order given, as a handoff and
// the end of Run do; the Leaser still counts them held until a renewal
// finds them lost or a claim takes them again.
func (l *Leaser) ReleaseNow(ctx context.Context, conn *pgx.Conn, leases []relay.Lease) error {
	return l.releaseLeases(ctx, conn, leases)
}
