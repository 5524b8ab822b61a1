package node

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestTableIntakeSettings: the intake of an adopted table runs with the
// node's poll and probe intervals, and a probe interval of 0 turns the
// probe off.
func TestTableIntakeSettings(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), DefaultConfig().PostgresURL) // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, tc := range []struct {
		probe, wantProbe time.Duration
	}{{40 * time.Millisecond, 40 * time.Millisecond}, {0, tablesource.NoProbe}} {
		cfg := DefaultConfig()
		cfg.TablePollMin, cfg.TablePollMax, cfg.TableProbeInterval = 30*time.Millisecond, 700*time.Millisecond, tc.probe
		s := &source{pool: pool, partitions: 8, table: &tableSource{layout: tablesource.Article()}}
		if _, err := newTableStore(cfg, s, "n1", nil); err != nil {
			t.Fatal(err)
		}
		in := s.table.intake
		if in.PollMin != cfg.TablePollMin || in.PollMax != cfg.TablePollMax || in.ProbeEvery != tc.wantProbe {
			t.Errorf("probe interval %v: intake runs with PollMin %v, PollMax %v, ProbeEvery %v; want %v, %v, %v",
				tc.probe, in.PollMin, in.PollMax, in.ProbeEvery, cfg.TablePollMin, cfg.TablePollMax, tc.wantProbe)
		}
	}
}
