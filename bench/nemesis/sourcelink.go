package nemesis

import (
	"context"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/node"
)

// sourceStatus is one source's part of a node's /status.
type sourceStatus = node.SourceStatus

// cutSource runs a source-link step: it cuts (or stalls) the link of the
// step's node to one source's database, its proxy for that source alone,
// and arms the step's isolationCheck on the other source: the partitions
// of the other source the node holds now must keep relaying, under its
// leases, while the cut source's leases on the node lapse. The heal
// restores the link and closes the check's window.
func (n *nemesis) cutSource(ctx context.Context, s plannedStep) (healFunc, error) {
	if len(n.dbs) < 2 || s.Source < 0 || s.Source >= len(n.dbs) {
		return noHeal, fmt.Errorf("source-link: source %d of %d", s.Source, len(n.dbs))
	}
	name, other := n.f.names()[s.Target], n.dbs[(s.Source+1)%len(n.dbs)]
	st, err := n.f.cl.Status(ctx, s.Target)
	if err != nil {
		return noHeal, err
	}
	held := heldEpochs(st.Sources, other.name, name)
	if len(held) == 0 {
		return noHeal, fmt.Errorf("source-link: %s holds no partition of %s to watch", name, other.name)
	}
	cutAt := time.Now()
	iso := &isolationCheck{Node: name, Source: other.name, Held: held, From: cutAt.Add(sourceLinkWatchFrom)}
	n.windows[len(n.windows)-1].Isolation = iso
	restore := cutLinks(s.Variant, n.f.pg[s.Target][s.Source])
	n.logf("  %s cut off from %s; it holds %d partitions of %s, which must keep relaying", name, n.dbs[s.Source].name, len(held), other.name)
	return once(func(ctx context.Context) error {
		iso.To = time.Now()
		iso.Kept = keptLeases(ctx, other, name, held)
		k := n.hist.countSince(iso.From, iso.holds)
		n.logf("  %s: %d messages of %s on %s's partitions under its leases from %v after the cut; %d of its %d leases kept",
			name, k, other.name, name, sourceLinkWatchFrom, iso.Kept, len(held))
		return restore(ctx)
	}), nil
}

// heldEpochs returns the partitions of source name that the node named
// owner holds by its status (held, and leased to it in the database), with
// their lease epochs. owner is the node's name.
func heldEpochs(sources []sourceStatus, name, owner string) map[int]int64 {
	out := map[int]int64{}
	for _, src := range sources {
		if src.Name != name {
			continue
		}
		held := map[int]bool{}
		for _, p := range src.Held {
			held[p] = true
		}
		for _, l := range src.Leases {
			if held[l.Partition] && l.Owner == owner {
				out[l.Partition] = l.Epoch
			}
		}
	}
	return out
}

// keptLeases returns how many of held (partition -> epoch) the node named
// owner still holds in db's ordo_leases at that epoch, unexpired; -1 when
// the query fails.
func keptLeases(ctx context.Context, db *runDB, owner string, held map[int]int64) int {
	var ps []int32
	var es []int64
	for p, e := range held {
		ps, es = append(ps, int32(p)), append(es, e)
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int
	err := db.pool.QueryRow(qctx, `SELECT count(*) FROM ordo_leases l
		JOIN unnest($1::int[], $2::bigint[]) AS h(p, e) ON l.partition = h.p AND l.epoch = h.e
		WHERE l.owner = $3 AND l.expires_at > now()`, ps, es, owner).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}
