package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/childproc"
	"github.com/ordo-relay/ordo/internal/ordercheck"
	"github.com/ordo-relay/ordo/orderapi"
	"github.com/ordo-relay/ordo/wire"
)

// stopGrace is how long a service gets to stop after SIGTERM.
const stopGrace = 15 * time.Second

// statusWait bounds the wait for the node to mark the last rows processed.
const statusWait = 5 * time.Second

// run is the whole demo. It returns nil when every expected event arrived
// in order, and stops the services it started before it returns.
func run(ctx context.Context, cfg config, con *console) (err error) {
	start := time.Now()

	con.Step("PostgreSQL: database %s", cfg.Database)
	dbURL, created, err := ensureDatabase(ctx, cfg.PostgresURL, cfg.Database)
	if err != nil {
		return err
	}
	if created {
		con.Printf("created database %s\n", cfg.Database)
	} else {
		con.Printf("using existing database %s\n", cfg.Database)
	}

	article := cfg.TableLayout != ""
	if article {
		con.Step("The article's outbox table")
		created, err := ensureArticleTable(ctx, dbURL)
		if err != nil {
			return err
		}
		if created {
			con.Printf("created %s exactly as the article's EF Core model does; no trigger, no column of Ordo's\n", articleTable)
		} else {
			con.Printf("using the existing %s\n", articleTable)
		}
		con.Step("Building cmd/node")
	} else {
		con.Step("Building cmd/node and cmd/orderapi")
	}
	defer childproc.RemoveBinaries()
	t0 := time.Now()
	nodeBin, apiBin, err := buildBinaries(ctx, !article)
	if err != nil {
		return err
	}
	con.Printf("built in %v\n", since(t0))

	con.Step("RabbitMQ: exchange %s, queue %s bound with order.*", cfg.Exchange, cfg.Queue)
	b, err := openBroker(cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	con.Printf("consuming from %s\n", cfg.Queue)

	nodeEnv := []string{"ORDO_NODE_NAME=demo-node"}
	if article {
		con.Step("Starting one node, relaying %s to %s", articleTable, cfg.Exchange)
		nodeEnv = append(nodeEnv, "ORDO_TABLE_LAYOUT="+cfg.TableLayout, "ORDO_TABLE_EXCHANGE="+cfg.Exchange)
	} else {
		con.Step("Starting the order API and one node")
	}
	apiAddr, err := childproc.PickAddr()
	if err != nil {
		return err
	}
	nodeAddr, err := childproc.PickAddr()
	if err != nil {
		return err
	}
	parts := strconv.Itoa(cfg.Partitions)
	launched := time.Now()
	var api *child // none with the article's table: the demo writes it
	if !article {
		api, err = startChild(con, "orderapi", apiBin, childEnv(
			"ORDO_POSTGRES_URL="+dbURL,
			"ORDO_HTTP_ADDR="+apiAddr,
			"ORDO_EXCHANGE="+cfg.Exchange,
			"ORDO_PARTITIONS="+parts,
			"ORDO_DB_MAX_CONNS=4",
		))
		if err != nil {
			return err
		}
	}
	// Stop the services whatever happens; the order API first, so that
	// the node has nothing new to publish while it stops.
	var node *child
	defer func() {
		stopErr := api.Stop(stopGrace)
		if node != nil {
			stopErr = errors.Join(stopErr, node.Stop(stopGrace))
		}
		if err == nil {
			err = stopErr
		}
	}()
	node, err = startChild(con, "node", nodeBin, childEnv(append(nodeEnv,
		"ORDO_POSTGRES_URL="+dbURL,
		"ORDO_AMQP_URL="+cfg.AMQPURL,
		"ORDO_HTTP_ADDR="+nodeAddr,
		"ORDO_PARTITIONS="+parts,
	)...))
	if err != nil {
		return err
	}
	client := newHTTPClient()
	defer client.CloseIdleConnections()
	apiURL, nodeURL := "http://"+apiAddr, "http://"+nodeAddr
	if !article {
		if err := waitReady(ctx, client, api, apiURL+"/healthz", cfg.Wait); err != nil {
			return err
		}
		con.Printf("order API ready at %s, %v after start\n", apiURL, since(launched))
	}
	if err := waitReady(ctx, client, node, nodeURL+"/readyz", cfg.Wait); err != nil {
		return err
	}
	con.Printf("node ready at %s, %v after start (it holds partition leases and is connected to the broker)\n", nodeURL, since(launched))

	var shipDB string
	if cfg.Keep {
		con.Step("Starting %d instances of the example consumer (cmd/shipping)", shippingInstances)
		ships, db, err := startShipping(ctx, con, cfg)
		if err != nil {
			return err
		}
		shipDB = db
		defer func() { _ = stopShipping(ships) }()
	}

	var orders []placedOrder
	if article {
		con.Step("Writing %d orders' events into %s as the article's service does, cancelling every other order", cfg.Orders, articleTable)
		orders, err = writeArticleOrders(ctx, con, dbURL, cfg.Orders)
	} else {
		con.Step("Placing %d orders and cancelling every other one", cfg.Orders)
		orders, err = placeOrders(ctx, con, client, apiURL, cfg.Orders)
	}
	if err != nil {
		return err
	}

	exp := newEvents(orders)
	con.Step("Events from queue %s (expecting %d)", cfg.Queue, exp.total)
	if err := receive(ctx, con, b.deliveries, exp, cfg.Wait, api, node); err != nil {
		return err
	}
	con.Printf("all %d events arrived, each order's in order, %v after the start\n", exp.total, since(start))

	if article {
		if err := showProcessed(ctx, con, dbURL, orders, statusWait); err != nil {
			return err
		}
	}

	con.Step("Node status (GET %s/status)", nodeURL)
	st, err := fetchStatus(ctx, client, nodeURL+"/status", statusWait)
	if err != nil {
		return err
	}
	waiting, owned := pending(st)
	con.Printf("node %s holds %d of %d partitions (the database agrees on %d); broker connected: %v\n",
		st.Node, len(st.Held), st.Partitions, owned, st.Broker)
	con.Printf("relay: %d published, %d confirmed, %d marked processed, %d failed\n",
		st.Relay.Published, st.Relay.Confirmed, st.Relay.Marked, st.Relay.Failed)
	con.Printf("outbox: %d pending\n", waiting)

	if cfg.Keep {
		if err := showProjection(ctx, con, shipDB, exp.total, cfg.Wait); err != nil {
			return err
		}
		if err := keep(ctx, con, b.deliveries, exp, apiURL, nodeURL, api, node); err != nil {
			return err
		}
	}

	con.Step("Stopping")
	if api != nil {
		if err := api.Stop(stopGrace); err != nil {
			return err
		}
		con.Printf("orderapi stopped\n")
	}
	if err := node.Stop(stopGrace); err != nil {
		return err
	}
	con.Printf("node stopped\n")
	con.Printf("\ndone in %v\n", since(start))
	return nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }

// events checks the events of this run's orders as they arrive, with the
// repository's one order checker (ordercheck.History): each expected event
// arrives, and each order's arrive in order.
type events struct {
	h     *ordercheck.History
	ours  map[string]bool // this run's order ids
	total int             // the events this run's own orders make
}

// eventsListCap bounds the lost events and problems the History lists.
const eventsListCap = 1000

func newEvents(orders []placedOrder) *events {
	e := &events{h: ordercheck.NewHistory(eventsListCap), ours: map[string]bool{}}
	for _, o := range orders {
		e.adopt(o.ID, orderapi.TypeOrderPlaced)
		e.total++
		if o.Cancelled {
			e.adopt(o.ID, orderapi.TypeOrderCancelled)
			e.total++
		}
	}
	return e
}

// adopt makes order's event of type typ expected (an order placed by
// hand is checked like the demo's own); expecting it again does nothing.
func (e *events) adopt(order, typ string) {
	e.ours[order] = true
	e.h.ExpectEvent(order, typ)
}

func (e *events) done() bool { return e.h.Report().Lost == 0 }

// record adds one delivery and returns a remark for it: "" for an
// expected event of one of this run's orders, in order; otherwise what it
// is.
func (e *events) record(d ordercheck.Delivery) string {
	if !e.ours[d.CorrelationID] {
		return "not from this run (an earlier run's event, or another producer's)"
	}
	before := e.h.Report()
	if e.h.Add(d) != ordercheck.First {
		return fmt.Sprintf("duplicate of key_seq %d: delivery is at least once; a consumer drops key_seq <= the last it applied", d.KeySeq)
	}
	after := e.h.Report()
	if after.Reorders+after.Gaps > before.Reorders+before.Gaps {
		msg := fmt.Sprintf("order %s: key_seq %d out of order", d.CorrelationID, d.KeySeq)
		if len(after.Problems) > len(before.Problems) {
			msg = after.Problems[len(after.Problems)-1]
		}
		return "OUT OF ORDER: " + msg
	}
	if after.Lost == before.Lost {
		return "unexpected event for this order"
	}
	return ""
}

// missing lists the events that have not arrived.
func (e *events) missing() []string {
	var m []string
	for _, id := range e.h.Report().LostIDs {
		order, typ, _ := strings.Cut(id, "/")
		m = append(m, fmt.Sprintf("order %s %s", order, typ))
	}
	return m
}

// outOfOrder lists the events that arrived out of order (reorders, and
// gaps: an event whose predecessor had not arrived).
func (e *events) outOfOrder() []string {
	r := e.h.Report()
	if r.Reorders+r.Gaps == 0 {
		return nil
	}
	return r.Problems
}

// receive prints deliveries until every expected event has arrived, wait
// passes, ctx ends, a service exits or the broker connection is lost.
func receive(ctx context.Context, con *console, deliveries <-chan amqp.Delivery, exp *events, wait time.Duration, api, node *child) error {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for !exp.done() {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the broker closed the demo's consumer (connection lost?)")
			}
			printDelivery(con, d, exp)
		case <-deadline.C:
			return fmt.Errorf("%d of %d events did not arrive within %v: %s", len(exp.missing()), exp.total, wait, strings.Join(exp.missing(), ", "))
		case <-ctx.Done():
			return fmt.Errorf("interrupted while waiting for events: %w", ctx.Err())
		case <-api.done():
			return fmt.Errorf("orderapi exited (see its output above): %v", api.exitError())
		case <-node.done():
			return fmt.Errorf("node exited (see its output above): %v", node.exitError())
		}
	}
	if wrong := exp.outOfOrder(); len(wrong) > 0 {
		return fmt.Errorf("events arrived out of order: %s", strings.Join(wrong, "; "))
	}
	return nil
}

// printDelivery prints one message and records it.
func printDelivery(con *console, d amqp.Delivery, exp *events) {
	remark := exp.record(ordercheck.DeliveryFromAMQP(d))
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s %s\n", d.RoutingKey, d.Type)
	fmt.Fprintf(&b, "    order (correlation-id) %s  %s %s", d.CorrelationId, wire.HeaderKeySeq, headerText(d.Headers, wire.HeaderKeySeq))
	if prev, ok := d.Headers[wire.HeaderPrevKeySeq]; ok {
		fmt.Fprintf(&b, " (prev %v)", prev)
	}
	fmt.Fprintf(&b, "  message-id %s\n", d.MessageId)
	fmt.Fprintf(&b, "    %s\n", compact(d.Body))
	if remark != "" {
		fmt.Fprintf(&b, "    ^ %s\n", remark)
	}
	con.Printf("%s", b.String())
}

func headerText(h amqp.Table, name string) string {
	v, ok := h[name]
	if !ok {
		return "(missing)"
	}
	return fmt.Sprint(v)
}

// keep leaves both services running and prints every event until ctx ends
// (Ctrl-C) or a service exits.
func keep(ctx context.Context, con *console, deliveries <-chan amqp.Delivery, exp *events, apiURL, nodeURL string, api, node *child) error {
	host := apiURL
	if u, err := url.Parse(apiURL); err == nil {
		host = u.Host
	}
	con.Step("Both services keep running; press Ctrl-C to stop")
	con.Printf("order API  %s   (POST /orders, POST /orders/{id}/cancel, GET /orders/{id})\n", apiURL)
	con.Printf("node       %s/status\n", nodeURL)
	con.Printf("try:\n  curl -s -X POST http://%s/orders -H 'Content-Type: application/json' \\\n"+
		"    -d '{\"customerId\":\"%s\",\"currency\":\"EUR\",\"items\":[{\"bookId\":\"%s\",\"quantity\":1,\"unitPrice\":\"9.90\"}]}'\n",
		host, exampleUUID1, exampleUUID2)
	con.Printf("events from the queue are printed below.\n\n")
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the broker closed the demo's consumer (connection lost?)")
			}
			// Orders placed by hand are checked like the demo's own.
			exp.adopt(d.CorrelationId, d.Type)
			printDelivery(con, d, exp)
		case <-ctx.Done():
			con.Printf("\n")
			return nil
		case <-api.done():
			return fmt.Errorf("orderapi exited (see its output above): %v", api.exitError())
		case <-node.done():
			return fmt.Errorf("node exited (see its output above): %v", node.exitError())
		}
	}
}

// Example ids for the curl command printed by -keep.
const (
	exampleUUID1 = "0190f5c2-7d1e-7a3b-9c4d-5e6f708192a3"
	exampleUUID2 = "0190f5c3-0000-7000-8000-00000000000a"
)
