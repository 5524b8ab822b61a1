// Command demo shows Ordo end to end on the local PostgreSQL and RabbitMQ:
//
//	go run ./cmd/demo
//
// It builds cmd/orderapi and cmd/node, starts one of each as child
// processes against a database of its own (ordo_demo, created when
// missing), places a few orders through the order API and cancels every
// other one, and prints each event as it arrives on a queue bound to the
// order events: type, order id (the correlation id and ordering key),
// x-ordo-key-seq, message id, routing key and body. It then prints the
// node's status and stops both services, or with -keep leaves them running
// until Ctrl-C.
//
// With -table-layout article the demo plays the article's own service
// instead of the order API: it creates the article's EF Core table
// ("OutboxMessages") in its database (ordo_demo_article by default),
// writes each order's events there with plain INSERTs that know nothing
// of Ordo, and runs the node with -table-layout article, which relays
// that table as it is and sets each row's "ProcessedAt" (docs/adopt.md).
//
// It exits 0 when every expected event arrived, in order, within -wait;
// otherwise 1, saying what is missing. Every flag has an environment
// equivalent (ORDO_POSTGRES_URL, ORDO_AMQP_URL, ...); see -h.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
)

// envPrefix prefixes the environment variable of every flag.
const envPrefix = "ORDO"

// config is what the flags and environment configure.
type config struct {
	// PostgresURL is an admin URL of the PostgreSQL server; the demo
	// database is created through it and reached by swapping its path.
	PostgresURL string
	// Database is the demo's own database, created when missing and kept
	// between runs.
	Database string
	// AMQPURL is the RabbitMQ URL the node publishes to and the demo
	// consumes from.
	AMQPURL string
	// Exchange is the topic exchange the order events go to; the demo
	// declares it (durable).
	Exchange string
	// Queue is the demo's queue, bound to Exchange with order.*: not
	// durable, deleted when the demo disconnects, exclusive to one demo.
	Queue string
	// Orders is how many orders to place; every other one is cancelled.
	Orders int
	// Partitions is the outbox partition count; it must match the one the
	// database was installed with.
	Partitions int
	// Wait bounds the wait for the events, and for each service to become
	// ready.
	Wait time.Duration
	// Keep leaves both services running, printing events, until Ctrl-C.
	Keep bool
	// TableLayout is "article" to write the events into the article's
	// own outbox table and have the node adopt it; "" for the order API
	// and Ordo's outbox.
	TableLayout string
}

// dbName is what the demo accepts as a database name: it is also put into
// a URL.
var dbName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// parseConfig reads args (without the program name) and the environment,
// through lookup, into a validated config. It returns flag.ErrHelp after
// printing usage to output when asked for -h.
func parseConfig(args []string, lookup func(string) (string, bool), output io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&c.PostgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "admin URL of the PostgreSQL server (the demo database is created through it)")
	fs.StringVar(&c.Database, "database", "", "the demo's database, created when missing (default ordo_demo, ordo_demo_article with -table-layout article)")
	fs.StringVar(&c.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	fs.StringVar(&c.Exchange, "exchange", "bookstore.ordering", "topic exchange of the order events (declared durable)")
	fs.StringVar(&c.Queue, "queue", "bookstore.demo", "the demo's queue (auto-delete, exclusive), bound with order.*")
	fs.IntVar(&c.Orders, "orders", 3, "orders to place; every other one is cancelled")
	fs.IntVar(&c.Partitions, "partitions", 64, "outbox partition count; must match the database's")
	fs.DurationVar(&c.Wait, "wait", 30*time.Second, "how long to wait for the events, and for each service to become ready")
	fs.BoolVar(&c.Keep, "keep", false, "keep both services running until Ctrl-C")
	fs.StringVar(&c.TableLayout, "table-layout", "", "article: write the events into the article's own table (\"OutboxMessages\") and have the node relay it as it is, instead of the order API")
	fs.Usage = envflag.Usage(fs, envPrefix, "usage: go run ./cmd/demo [flags]\n\nRuns the order API and one Ordo node on the local servers, places orders\nand prints the events as RabbitMQ delivers them.")
	if err := envflag.Parse(fs, envPrefix, args, lookup); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.Database == "" {
		c.Database = "ordo_demo"
		if c.TableLayout != "" {
			c.Database = "ordo_demo_article"
		}
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case !dbName.MatchString(c.Database):
		return fmt.Errorf("-database %q: use lower-case letters, digits and _ (at most 63)", c.Database)
	case c.Exchange == "":
		return errors.New("-exchange is empty")
	case c.Queue == "":
		return errors.New("-queue is empty")
	case c.Orders < 1 || c.Orders > 1000:
		return fmt.Errorf("-orders %d: between 1 and 1000", c.Orders)
	case c.Partitions < 1:
		return fmt.Errorf("-partitions %d: at least 1", c.Partitions)
	case c.Wait <= 0:
		return fmt.Errorf("-wait %v: must be positive", c.Wait)
	case c.TableLayout != "" && c.TableLayout != "article":
		return fmt.Errorf("-table-layout %q: the demo knows the article's table only (article)", c.TableLayout)
	case c.TableLayout != "" && c.Keep:
		return errors.New("-keep places orders through the order API: not with -table-layout")
	}
	return nil
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg, newConsole(os.Stdout, os.Stderr))
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
