package node

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay/tablesource"
	"github.com/ordo-relay/ordo/wire"
)

// MaxSources is the most sources one node relays. Every source's name,
// and a token of its database's identity, travel in the node's gossip
// metadata, which memberlist caps at 512 bytes: twelve names of
// wire.MaxSourceLen bytes fit with a token of 4 characters each, twelve
// of up to 28 bytes with whole tokens of 8 (membership.IdentityLen).
const MaxSources = 12

// Source is one outbox database the node relays (docs/design.md,
// "Sources"). Everything fenced by the database is per source: its pool,
// migrations, leases, audit, relay store and backlog. The broker
// connection, gossip and the HTTP server are the node's.
type Source struct {
	// Name identifies the source: the x-ordo-source header of its
	// messages, the `source` label of its metrics, the key of its
	// partitions on /status and the -source of the CLI. It follows
	// wire.ValidateSource; wire.DefaultSource is the database of the
	// one-source form (PostgresURL), whose messages carry no header.
	Name string

	// PostgresURL is the source's database, as pgx parses it.
	PostgresURL string

	// Partitions is the source's partition count P: 0, the default,
	// means Config.Partitions. Like Config.Partitions it is fixed in the
	// source's database when its outbox is installed, and a node
	// configured with another count for it refuses to start, so every
	// node that relays the source uses the count its database holds.
	// 1..4096 when set.
	Partitions int

	// Layout, when set, makes the node relay a table Ordo did not create
	// in this source's database instead of Ordo's own outbox: a table
	// layout spec, as Config.TableLayout (the one-source form's). Empty,
	// the default: Ordo's own outbox.
	Layout string
}

// sources returns the sources the node relays: Sources when set, else
// the one-source form, PostgresURL named wire.DefaultSource; each with
// its partition count resolved (Config.Partitions where it has none).
// Everything that needs a source's count reads it here.
func (c Config) sources() []Source {
	srcs := []Source{{Name: wire.DefaultSource, PostgresURL: c.PostgresURL, Layout: c.TableLayout}}
	if len(c.Sources) > 0 {
		srcs = slices.Clone(c.Sources)
	}
	for i := range srcs {
		if srcs[i].Partitions == 0 {
			srcs[i].Partitions = c.Partitions
		}
	}
	return srcs
}

// validateSources records every problem of Sources: too many, a bad or
// repeated name, a URL pgx cannot parse, a partition count out of range.
// Each is reported at "Sources".
func (c Config) validateSources(ck *confcheck.Checker) {
	ck.Require(len(c.Sources) <= MaxSources, "Sources", "%d sources, at most %d (they are gossiped)", len(c.Sources), MaxSources)
	var seen []string
	for _, s := range c.Sources {
		if s.Name == "" || s.PostgresURL == "" {
			ck.Require(false, "Sources", "a source without a name or a URL: want NAME=POSTGRES_URL")
			continue
		}
		if err := wire.ValidateSource(s.Name); err != nil {
			ck.Require(false, "Sources", "%v", err)
		} else if slices.Contains(seen, s.Name) {
			ck.Require(false, "Sources", "source %q is given twice", s.Name)
		}
		seen = append(seen, s.Name)
		if _, err := pgxpool.ParseConfig(s.PostgresURL); err != nil {
			ck.Require(false, "Sources", "source %q: %v", s.Name, redact(err))
		}
		if s.Partitions != 0 {
			err := partition.ValidateCount(s.Partitions)
			ck.Require(err == nil, "Sources", "source %q: %v (0 means Partitions)", s.Name, err)
		}
		if s.Layout != "" {
			_, err := tablesource.ParseLayout(s.Layout)
			ck.Require(err == nil, "Sources", "source %q: %v", s.Name, err)
		}
	}
}

// redact returns err's message without what a URL parse error may quote
// of the URL (a password): pgx's parse errors name the URL.
func redact(err error) string {
	return fmt.Sprintf("the PostgreSQL URL does not parse (%T)", err)
}

// eligibleFor is what the assignment needs of membership: the members
// eligible for each source (membership.Membership.EligibleFor).
type eligibleFor interface {
	EligibleFor(source string) []string
}

// assignSources returns the map over (source, partition) pairs of
// sources, each of its own partition count, as every node computes it from
// its view of the members: partition.AssignSources over the members
// eligible for at least one source, each source's draft without those
// not eligible for it (partition.Source.Without). A node cut off from one
// database is left out of that source only, and the balance over all
// pairs holds whenever nobody is left out. With the one source default
// it is partition.Assign over membership.Eligible, as before sources.
func assignSources(m eligibleFor, sources []Source) partition.SourceAssignment {
	eligible := make(map[string][]string, len(sources))
	var all []string
	for _, s := range sources {
		eligible[s.Name] = m.EligibleFor(s.Name)
		all = append(all, eligible[s.Name]...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	srcs := make([]partition.Source, len(sources))
	for i, s := range sources {
		srcs[i] = partition.Source{Name: s.Name, Count: s.Partitions,
			Without: slices.DeleteFunc(slices.Clone(all), func(m string) bool { return slices.Contains(eligible[s.Name], m) })}
	}
	a, err := partition.AssignSources(all, srcs)
	if err != nil {
		return nil // Config.Validate checked names and counts: not expected
	}
	return a
}

// sourceNames returns the names of sources, in order.
func sourceNames(sources []Source) []string {
	names := make([]string, len(sources))
	for i, s := range sources {
		names[i] = s.Name
	}
	return names
}

// sourceCounts returns each source's partition count as "name/P",
// space-separated, for the log.
func sourceCounts(srcs []*source) string {
	parts := make([]string, len(srcs))
	for i, s := range srcs {
		parts[i] = fmt.Sprintf("%s/%d", s.name, s.partitions)
	}
	return strings.Join(parts, " ")
}

// waiting returns the names of the sources not migrated yet,
// space-separated, for the log: they start once their database answers.
func waiting(srcs []*source) string {
	var names []string
	for _, s := range srcs {
		if !s.isMigrated() {
			names = append(names, s.name)
		}
	}
	return strings.Join(names, " ")
}
