package measure

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/partition"
)

// Common are the flags every scenario shares. They come before the first
// scenario's name: go run ./bench -quick -node-bin /tmp/node drain.
type Common struct {
	PostgresURL   string        // admin URL: the bench creates its databases through it
	AMQPURL       string        // broker; the consumer always connects here directly
	Out           string        // directory for the JSON results
	Partitions    int           // P, given to the node and to outbox.Migrate
	ConfirmWindow int           // W, given to the node
	NodeBin       string        // a prebuilt node binary; empty builds ./cmd/node
	Timeout       time.Duration // bound on every wait of a scenario
	Quick         bool          // smaller defaults for a quick look (quickDefaults)
}

// DefaultCommon returns the common flags' defaults.
func DefaultCommon() Common {
	return Common{
		PostgresURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		AMQPURL:     "amqp://guest:guest@127.0.0.1:5672/", Out: "bench/results",
		Partitions: partition.DefaultCount, ConfirmWindow: 512, Timeout: 10 * time.Minute,
	}
}

// AddCommonFlags registers the common flags on fs.
func AddCommonFlags(fs *flag.FlagSet, c *Common) {
	fs.StringVar(&c.PostgresURL, "postgres-url", c.PostgresURL, "PostgreSQL admin URL (the bench creates and drops its own databases)")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL")
	fs.StringVar(&c.Out, "out", c.Out, "directory for the JSON results")
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "partition count P")
	fs.IntVar(&c.ConfirmWindow, "confirm-window", c.ConfirmWindow, "the node's confirm window W")
	fs.StringVar(&c.NodeBin, "node-bin", c.NodeBin, "prebuilt node binary (default: go build -tags ordobench ./cmd/node)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on every wait")
	fs.BoolVar(&c.Quick, "quick", c.Quick, "smaller defaults for a quick look: rows 20000, keys 2000, duration 10s, orders 1000, reps 1, "+
		"scale-rows 2000, scale-hot-rows 500, consume-orders 300, consume-latency 3s (a scenario's flags given win)")
}

// listFlag is a flag whose text set parses into a field of options.
type listFlag struct {
	text string
	set  func(string) error
}

func (f *listFlag) String() string {
	if f == nil {
		return ""
	}
	return f.text
}

func (f *listFlag) Set(s string) error {
	if err := f.set(s); err != nil {
		return err
	}
	f.text = s
	return nil
}

// ListVar registers a list flag whose default text is def.
func ListVar(fs *flag.FlagSet, name, def, usage string, set func(string) error) {
	fs.Var(&listFlag{text: def, set: set}, name, usage)
}

// CountsVar registers a flag of comma-separated counts from 1 to 8
// (ParseCounts) bound to p, with *p as its default.
func CountsVar(fs *flag.FlagSet, name string, p *[]int, usage string) {
	ListVar(fs, name, JoinInts(*p), usage, func(s string) (err error) {
		*p, err = ParseCounts(name, s)
		return err
	})
}

// JoinInts is "1,2,3".
func JoinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// Check reports the common flags out of range.
func (c Common) Check() error {
	var errs []error
	if c.ConfirmWindow < 1 || c.ConfirmWindow > 65535 {
		errs = append(errs, fmt.Errorf("confirm-window %d out of range 1..65535", c.ConfirmWindow))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout %v must be positive", c.Timeout))
	}
	return errors.Join(append(errs, partition.ValidateCount(c.Partitions))...)
}

// Base returns the common flags of the options that embed c.
func (c *Common) Base() *Common { return c }

// ParseCounts parses "1,2,3" into positive counts of at most 8.
func ParseCounts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 8 {
			return nil, fmt.Errorf("-%s %q: want comma-separated counts from 1 to 8", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}
