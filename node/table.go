package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// DefaultTableExchange is Config.TableExchange's default: the article's
// exchange.
const DefaultTableExchange = "bookstore.ordering"

// maxExchangeLen is the longest exchange name AMQP carries (a short
// string).
const maxExchangeLen = 255

// validateTable checks TableLayout and TableExchange (Sources' layouts
// are validateSources').
func (c Config) validateTable(ck *confcheck.Checker) {
	if c.TableLayout != "" {
		_, err := tablesource.ParseLayout(c.TableLayout)
		ck.Require(err == nil, "TableLayout", "%v", err)
		ck.Require(len(c.Sources) == 0, "TableLayout",
			"applies to the one-source form (PostgresURL) only; with Sources give each source its layout (Source.Layout, -source-layout)")
	}
	if slices.ContainsFunc(c.sources(), func(s Source) bool { return s.Layout != "" }) {
		ck.Require(c.TableExchange != "" && len(c.TableExchange) <= maxExchangeLen, "TableExchange",
			"%q: want 1 to %d bytes", c.TableExchange, maxExchangeLen)
		ck.Require(c.TablePollMin > 0, "TablePollMin", "%v: want more than 0", c.TablePollMin)
		ck.Require(c.TablePollMax >= c.TablePollMin, "TablePollMax", "%v is shorter than TablePollMin (%v)", c.TablePollMax, c.TablePollMin)
		ck.Require(c.TableProbeInterval >= 0, "TableProbeInterval", "%v is negative (0 turns the probe off)", c.TableProbeInterval)
	}
}

// tableLayout returns the layout of the table source sc relays instead
// of Ordo's own outbox, and false when it relays Ordo's own outbox.
func tableLayout(sc Source) (tablesource.Layout, bool) {
	if sc.Layout == "" {
		return tablesource.Layout{}, false
	}
	l, err := tablesource.ParseLayout(sc.Layout)
	return l, err == nil // Validate refused the other specs
}

// tableSource is what a source relaying an adopted table adds: the
// intake, run by the holder of partition 0, and the store.
type tableSource struct {
	layout tablesource.Layout
	intake *tablesource.Intake
	store  *tablesource.Store // for its late-row count
}

// newTableStore returns the relay store over the adopted table of s and
// sets s.table's intake.
func newTableStore(cfg Config, s *source, node string, logger *slog.Logger) (relay.Store, error) {
	l := s.table.layout
	store, err := tablesource.NewStore(s.pool, node, l, cfg.TableExchange, logger)
	if err != nil {
		return nil, err
	}
	reader, err := tablesource.NewReader(l, s.partitions)
	if err != nil {
		return nil, err
	}
	s.table.intake = tablesource.NewIntake(s.pool, node, reader, logger)
	s.table.intake.PollMin, s.table.intake.PollMax = cfg.TablePollMin, cfg.TablePollMax
	s.table.intake.ProbeEvery = cfg.TableProbeInterval
	if cfg.TableProbeInterval == 0 {
		s.table.intake.ProbeEvery = tablesource.NoProbe
	}
	s.table.store = store
	return store, nil
}

// migrateTable creates Ordo's tables for an adopted table, installs or
// checks its partition count, and checks the user's table against the
// layout.
func migrateTable(ctx context.Context, db *pgx.Conn, l tablesource.Layout, partitions int) error {
	if err := tablesource.Migrate(ctx, db, partitions); err != nil {
		return err
	}
	if err := tablesource.Check(ctx, db, l); err != nil {
		return fmt.Errorf("adopted table: %w", err)
	}
	return nil
}

// DryRunPage and DryRunSampleKeys are the page and the sampled keys of
// the dry run (TableDryRun).
const (
	DryRunPage       = 500
	DryRunSampleKeys = 5
)

// SourceDryRun is the dry run's report of one source relaying an adopted
// table (tablesource.Report, as printed).
type SourceDryRun struct {
	Source                   string              `json:"source"`
	Layout                   string              `json:"layout"`
	At                       time.Time           `json:"at"`
	Pending                  int                 `json:"pending"`
	Keys                     int                 `json:"keys"`
	KeysWithoutCorrelationID int                 `json:"keysWithoutCorrelationId"`
	PerPartition             []int               `json:"perPartition"`
	OldestOccurredAt         *time.Time          `json:"oldestOccurredAt,omitempty"`
	OldestAge                string              `json:"oldestAge"`
	Bad                      []DryRunBadRow      `json:"bad"`
	Samples                  map[string][]string `json:"samples"`
}

// DryRunBadRow is a row the relay would park, and why.
type DryRunBadRow struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

func sourceDryRun(source, layout string, r tablesource.Report) SourceDryRun {
	out := SourceDryRun{Source: source, Layout: layout, At: r.At, Pending: r.Pending, Keys: r.Keys,
		KeysWithoutCorrelationID: r.KeysWithoutCorrelationID, PerPartition: r.PerPartition,
		OldestAge: r.OldestAge.String(), Bad: []DryRunBadRow{}, Samples: r.Samples}
	if !r.OldestOccurredAt.IsZero() {
		out.OldestOccurredAt = &r.OldestOccurredAt
	}
	for _, b := range r.Bad {
		out.Bad = append(out.Bad, DryRunBadRow{ID: b.Row.ID.String(), Key: b.Row.Key, Reason: b.Reason})
	}
	return out
}

// TableDryRun reads what the node configured by cfg would publish from
// each adopted table of its sources (tablesource.Reader.DryRun), and
// returns one report per such source: counts, keys, partitions, the
// oldest pending age, the rows that would be parked and sampled keys'
// order. It creates nothing, takes no lease, publishes and marks
// nothing, so it runs beside the table's old relay. Each source's
// partition count is its configured one (the database's, once Ordo was
// installed there, must be the same).
func TableDryRun(ctx context.Context, cfg Config) ([]SourceDryRun, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var out []SourceDryRun
	for _, sc := range cfg.sources() {
		l, ok := tableLayout(sc)
		if !ok {
			continue
		}
		rep, err := dryRunSource(ctx, cfg, sc, l)
		if err != nil {
			return out, fmt.Errorf("source %s: %w", sc.Name, err)
		}
		out = append(out, sourceDryRun(sc.Name, sc.Layout, rep))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no source relays an adopted table: give -table-layout, or -source-layout with -source")
	}
	return out, nil
}

func dryRunSource(ctx context.Context, cfg Config, sc Source, l tablesource.Layout) (tablesource.Report, error) {
	pool, _, err := openPool(ctx, cfg, sc.PostgresURL)
	if err != nil {
		return tablesource.Report{}, err
	}
	defer pool.Close()
	if err := tablesource.Check(ctx, pool, l); err != nil {
		return tablesource.Report{}, err
	}
	r, err := tablesource.NewReader(l, sc.Partitions)
	if err != nil {
		return tablesource.Report{}, err
	}
	return r.DryRun(ctx, pool, DryRunPage, DryRunSampleKeys)
}
