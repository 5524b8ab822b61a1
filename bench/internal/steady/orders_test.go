package steady

import (
	"context"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestOrdersEndToEnd runs the orders scenario briefly on the real servers
// (the order API and a node as processes): every order placed is created
// and its event delivered, and the figures say so.
func TestOrdersEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and RabbitMQ")
	}
	testkit.RequirePostgres(t)
	testkit.RequireRabbitMQ(t)
	o := DefaultOrdersOptions()
	o.Common = measure.Common{PostgresURL: testkit.PostgresURL(), AMQPURL: testkit.AMQPURL(), Out: t.TempDir(), Partitions: 8,
		ConfirmWindow: 64, Timeout: time.Minute}
	o.Rate, o.Workers, o.Duration, o.Warmup, o.APIConns = 50, 4, 2*time.Second, 500*time.Millisecond, 4
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var got []*result.Result
	if err := RunOrders(ctx, o, func(r *result.Result) { got = append(got, r) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d results, want 1", len(got))
	}
	res := got[0]
	orders, _ := res.Lookup("orders")
	measured, _ := res.Lookup("measured")
	failed, _ := res.Lookup("failed")
	p99, _ := res.Lookup("delivery_p99")
	if orders < 50 || measured < 1 || measured >= orders || failed != 0 || p99 <= 0 {
		t.Errorf("orders %v, measured %v, failed %v, delivery p99 %v ms: want about 100 orders, some measured, none failed",
			orders, measured, failed, p99)
	}
	if !res.Passed() || res.Check.Total != int(orders) || res.Check.Lost != 0 {
		t.Errorf("check %+v, want every one of %v orders' events once", res.Check, orders)
	}
}
