package nemesis

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// TestPlantedRowWithoutKeySeq: with the key_seq trigger dropped (-lean)
// a planted row has no key_seq at insert; insertBad returns 0 instead of
// failing on the NULL, and numbered takes the number the owner gave it
// later, or says the row was never numbered.
func TestPlantedRowWithoutKeySeq(t *testing.T) {
	testkit.RequirePostgres(t)
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	if err := outbox.Migrate(ctx, pool, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP TRIGGER outbox_assign_key_seq ON outbox`); err != nil {
		t.Fatal(err)
	}
	producer, err := outbox.NewProducer(8)
	if err != nil {
		t.Fatal(err)
	}
	n := &nemesis{o: Config{Partitions: 8, Lean: true}, producer: producer, f: &fleet{exchange: "ex"},
		voidExchange: "void", missingExchange: "missing"}
	db := &runDB{name: "default", pool: pool}
	for _, why := range []string{"hostile", "returned"} {
		var row planted
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, keySeq, err := n.insertBad(ctx, tx, "order-"+why, why)
			row = planted{db: db, id: id, key: "order-" + why, keySeq: keySeq, why: why}
			return err
		})
		if err != nil || row.keySeq != 0 {
			t.Fatalf("%s: insertBad without the trigger: key_seq %d, %v; want 0, nil", why, row.keySeq, err)
		}
		if err := row.numbered(ctx); err == nil || !strings.Contains(err.Error(), "not numbered") {
			t.Fatalf("%s: numbered before the owner numbered it: %v", why, err)
		}
		if _, err := pool.Exec(ctx, `UPDATE outbox SET key_seq = 7 WHERE id = $1`, row.id); err != nil {
			t.Fatal(err)
		}
		if err := row.numbered(ctx); err != nil || row.keySeq != 7 {
			t.Fatalf("%s: numbered: key_seq %d, %v; want 7", why, row.keySeq, err)
		}
	}
}
