package lease

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/confcheck"
)

// DefaultTTL is the lease lifetime of DefaultConfig.
const DefaultTTL = 2 * time.Second

// Config configures a Leaser. Start from DefaultConfig or ConfigWithTTL,
// set Node, Want and Connect, and change what else you need. New gives a
// zero TTL its default and zero Margin, RenewEvery and HandoffTimeout
// their ConfigWithTTL values, and refuses a Config that Validate then
// refuses.
type Config struct {
	// Node is this node's name, stored as the owner of every lease it
	// claims. It must be unique among live nodes: a second process with
	// the same name would take the first one's leases at once.
	Node string

	// TTL is how long a claim or a renewal holds a lease in the database.
	// A node that stops renewing (crashed, paused, cut off) loses its
	// partitions to other nodes at most TTL after its last renewal, so
	// TTL bounds failover; every renewal is a write, so a shorter TTL
	// costs more database work.
	TTL time.Duration

	// Margin is taken off the local lease deadline: the node stops
	// publishing under a lease at the time it sent its last successful
	// claim or renewal, plus TTL, minus Margin. It covers clock rate
	// differences and the time between the deadline check and a publish.
	// Must be below TTL.
	Margin time.Duration

	// RenewEvery is the renewal period. It must leave room for a failed
	// renewal to be retried before the local deadline: below TTL − Margin.
	RenewEvery time.Duration

	// HandoffTimeout bounds a handoff: a partition no longer wanted is
	// released when the relay acknowledges its Revoked (nothing of it in
	// flight any more), or HandoffTimeout after the revoke began,
	// whichever comes first. Past it, unconfirmed rows stay pending for
	// the next owner, which may publish them again (at least once).
	HandoffTimeout time.Duration

	// Want returns the partitions this node should hold now, ascending.
	// A node alone wants them all; a cluster member computes them from
	// the membership (partition.Assignment.Owned). It is called on every
	// tick and must not block.
	Want func() []int

	// Wake, when signalled, makes the leaser act on Want at once instead
	// of at its next renewal, e.g. on a membership change
	// (membership.Membership.Changed). Nil: renewals only.
	Wake <-chan struct{}

	// Connect opens the leaser's dedicated connection. The leaser commits
	// every claim and renewal on it, so it should commit synchronously.
	Connect func(ctx context.Context) (*pgx.Conn, error)

	// Logger receives claims, losses, handoffs and outages. Nil:
	// slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults for a lease TTL of DefaultTTL.
func DefaultConfig() Config { return ConfigWithTTL(DefaultTTL) }

// ConfigWithTTL returns the defaults for a lease TTL of ttl, those of the
// lease timing rule (TimingFor): a margin of TTL/4, a renewal every TTL/3
// and a handoff timeout of TTL/2.
func ConfigWithTTL(ttl time.Duration) Config { return TimingFor(ttl).Config() }

// withDefaults returns c with a zero TTL set to DefaultTTL, and a zero
// Margin, RenewEvery or HandoffTimeout set to its ConfigWithTTL value for
// that TTL.
func (c Config) withDefaults() Config {
	confcheck.Fill(&c.TTL, DefaultTTL)
	d := ConfigWithTTL(c.TTL)
	confcheck.Fill(&c.Margin, d.Margin)
	confcheck.Fill(&c.RenewEvery, d.RenewEvery)
	confcheck.Fill(&c.HandoffTimeout, d.HandoffTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every unusable setting of c as it stands (before New
// fills zero fields), joined; each is a *confcheck.Problem naming its
// field.
func (c Config) Validate() error {
	ck := confcheck.New("lease")
	ck.Require(c.Node != "", "Node", "is empty; the node's name is required")
	checkLease(ck, c.TTL, c.Margin, c.RenewEvery, c.HandoffTimeout)
	ck.Require(c.Want != nil, "Want", "is nil; the leaser must be told what to claim")
	ck.Require(c.Connect != nil, "Connect", "is nil; the leaser needs a connection")
	return ck.Err()
}
