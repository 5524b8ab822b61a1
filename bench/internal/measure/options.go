package measure

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Each scenario runs with options of its own type, defined next to its
// run function (drain.Options in drain.go, compareOptions in compare.go):
// the common flags (common, flags.go) and the flags it alone registers,
// which follow its name on the command line. Flags that several scenarios
// share are the small embedded structs of this file, each registered by
// one method (backlog, traffic, KeyedTraffic, ClassicPolling), so that
// their name, usage and check are the same wherever they appear. Zero
// Keys and Rate mean "the scenario's default", which the scenario's doc
// states.

// Backlog is the pending rows a drain starts from: -rows, -keys and
// -payload of drain, classic and broker.
type Backlog struct {
	Rows    int // messages
	Keys    int // distinct correlation ids (0: the scenario's default)
	Payload int // approximate payload size in bytes
}

func DefaultBacklog() Backlog { return Backlog{Rows: 100000, Payload: 300} }

func (b *Backlog) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&b.Rows, "rows", b.Rows, "messages")
	KeysVar(fs, &b.Keys)
	PayloadVar(fs, &b.Payload)
}

func (b Backlog) Validate() error {
	var errs []error
	if b.Rows < 1 {
		errs = append(errs, fmt.Errorf("rows %d must be positive", b.Rows))
	}
	return errors.Join(append(errs, CheckKeys(b.Keys), CheckPayload(b.Payload))...)
}

// Traffic is a steady producer load: -payload, -rate and -workers.
type Traffic struct {
	Payload int // approximate payload size in bytes
	Rate    int // commits a second; race: orders a second (0: the scenario's default)
	Workers int // producer goroutines, one connection each
}

func DefaultTraffic() Traffic { return Traffic{Payload: 300, Workers: 16} }

func (t *Traffic) AddFlags(fs *flag.FlagSet) {
	PayloadVar(fs, &t.Payload)
	RateVar(fs, &t.Rate)
	WorkersVar(fs, &t.Workers)
}

func (t Traffic) Validate() error {
	return errors.Join(CheckPayload(t.Payload), CheckRate(t.Rate), CheckWorkers(t.Workers))
}

// KeyedTraffic is a steady load over -keys keys: outage, latency,
// classic-latency, failover and join.
type KeyedTraffic struct {
	Traffic
	Keys int // distinct correlation ids (0: the scenario's default)
}

func DefaultKeyedTraffic() KeyedTraffic { return KeyedTraffic{Traffic: DefaultTraffic()} }

func (k *KeyedTraffic) AddFlags(fs *flag.FlagSet) {
	k.Traffic.AddFlags(fs)
	KeysVar(fs, &k.Keys)
}

func (k KeyedTraffic) Validate() error { return errors.Join(k.Traffic.Validate(), CheckKeys(k.Keys)) }

// ClassicPolling is how the classic relay polls: -classic-batch and
// -classic-interval of the scenarios that run it.
type ClassicPolling struct {
	ClassicBatch int           // rows per batch
	ClassicEvery time.Duration // polling interval
}

// DefaultClassicPolling is the article's relay: 50 rows a second.
func DefaultClassicPolling() ClassicPolling {
	return ClassicPolling{ClassicBatch: 50, ClassicEvery: time.Second}
}

func (c *ClassicPolling) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.ClassicBatch, "classic-batch", c.ClassicBatch, "classic relay: rows per batch")
	fs.DurationVar(&c.ClassicEvery, "classic-interval", c.ClassicEvery, "classic relay: polling interval")
}

func (c ClassicPolling) Validate() error {
	if c.ClassicBatch < 1 || c.ClassicEvery <= 0 {
		return errors.New("classic-batch and classic-interval must be positive")
	}
	return nil
}

// KeysVar, PayloadVar, RateVar and WorkersVar register the flags that
// scenarios share outside the structs above.
func KeysVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "keys", *p, "distinct correlation ids (0: the scenario's default)")
}

func PayloadVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "payload", *p, "approximate JSON payload size in bytes")
}

func RateVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "rate", *p, "commits per second, orders per second in race (0: the scenario's default)")
}

func WorkersVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "workers", *p, "producer goroutines, one connection each")
}

func CheckKeys(n int) error {
	if n < 0 {
		return fmt.Errorf("keys %d must not be negative", n)
	}
	return nil
}

func CheckPayload(n int) error {
	if n < 0 || n > 1<<20 {
		return fmt.Errorf("payload %d out of range 0..1MiB", n)
	}
	return nil
}

func CheckRate(n int) error {
	if n < 0 {
		return fmt.Errorf("rate %d must not be negative", n)
	}
	return nil
}

func CheckWorkers(n int) error {
	if n < 1 || n > 32 {
		return fmt.Errorf("workers %d out of range 1..32", n)
	}
	return nil
}

// OrDefault returns v, or def when v was left at 0 (-keys, -rate).
func OrDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
