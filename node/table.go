package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

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
		_, err := tablesource.Preset(c.TableLayout)
		ck.Require(err == nil, "TableLayout", "%v", err)
		ck.Require(len(c.Sources) == 0, "TableLayout",
			"applies to the one-source form (PostgresURL) only; with Sources give each source its layout (Source.Layout, -source-layout)")
	}
	if slices.ContainsFunc(c.sources(), func(s Source) bool { return s.Layout != "" }) {
		ck.Require(c.TableExchange != "" && len(c.TableExchange) <= maxExchangeLen, "TableExchange",
			"%q: want 1 to %d bytes", c.TableExchange, maxExchangeLen)
	}
}

// tableLayout returns the layout of the table source sc relays instead
// of Ordo's own outbox, and false when it relays Ordo's own outbox.
func tableLayout(sc Source) (tablesource.Layout, bool) {
	if sc.Layout == "" {
		return tablesource.Layout{}, false
	}
	l, err := tablesource.Preset(sc.Layout)
	return l, err == nil // Validate refused the other names
}

// tableSource is what a source relaying an adopted table adds: the
// intake, run by the holder of partition 0.
type tableSource struct {
	layout tablesource.Layout
	intake *tablesource.Intake
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
	return store, nil
}

// migrateTable creates Ordo's tables for an adopted table and checks the
// user's table against the layout.
func migrateTable(ctx context.Context, db *pgx.Conn, l tablesource.Layout) error {
	if err := tablesource.Migrate(ctx, db); err != nil {
		return err
	}
	if err := tablesource.Check(ctx, db, l); err != nil {
		return fmt.Errorf("adopted table: %w", err)
	}
	return nil
}
