package main

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Each scenario runs with options of its own type, defined next to its
// run function (drainOptions in drain.go, compareOptions in compare.go):
// the common flags (common, flags.go) and the flags it alone registers,
// which follow its name on the command line. Flags that several scenarios
// share are the small embedded structs of this file, each registered by
// one method (backlog, traffic, keyedTraffic, classicPolling), so that
// their name, usage and check are the same wherever they appear. Zero
// Keys and Rate mean "the scenario's default", which the scenario's doc
// states.

// backlog is the pending rows a drain starts from: -rows, -keys and
// -payload of drain, classic and broker.
type backlog struct {
	Rows    int // messages
	Keys    int // distinct correlation ids (0: the scenario's default)
	Payload int // approximate payload size in bytes
}

func defaultBacklog() backlog { return backlog{Rows: 100000, Payload: 300} }

func (b *backlog) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&b.Rows, "rows", b.Rows, "messages")
	keysVar(fs, &b.Keys)
	payloadVar(fs, &b.Payload)
}

func (b backlog) validate() error {
	var errs []error
	if b.Rows < 1 {
		errs = append(errs, fmt.Errorf("rows %d must be positive", b.Rows))
	}
	return errors.Join(append(errs, checkKeys(b.Keys), checkPayload(b.Payload))...)
}

// traffic is a steady producer load: -payload, -rate and -workers.
type traffic struct {
	Payload int // approximate payload size in bytes
	Rate    int // commits a second; race: orders a second (0: the scenario's default)
	Workers int // producer goroutines, one connection each
}

func defaultTraffic() traffic { return traffic{Payload: 300, Workers: 16} }

func (t *traffic) addFlags(fs *flag.FlagSet) {
	payloadVar(fs, &t.Payload)
	rateVar(fs, &t.Rate)
	workersVar(fs, &t.Workers)
}

func (t traffic) validate() error {
	return errors.Join(checkPayload(t.Payload), checkRate(t.Rate), checkWorkers(t.Workers))
}

// keyedTraffic is a steady load over -keys keys: outage, latency,
// classic-latency, failover and join.
type keyedTraffic struct {
	traffic
	Keys int // distinct correlation ids (0: the scenario's default)
}

func defaultKeyedTraffic() keyedTraffic { return keyedTraffic{traffic: defaultTraffic()} }

func (k *keyedTraffic) addFlags(fs *flag.FlagSet) {
	k.traffic.addFlags(fs)
	keysVar(fs, &k.Keys)
}

func (k keyedTraffic) validate() error { return errors.Join(k.traffic.validate(), checkKeys(k.Keys)) }

// classicPolling is how the classic relay polls: -classic-batch and
// -classic-interval of the scenarios that run it.
type classicPolling struct {
	ClassicBatch int           // rows per batch
	ClassicEvery time.Duration // polling interval
}

// defaultClassicPolling is the article's relay: 50 rows a second.
func defaultClassicPolling() classicPolling {
	return classicPolling{ClassicBatch: 50, ClassicEvery: time.Second}
}

func (c *classicPolling) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.ClassicBatch, "classic-batch", c.ClassicBatch, "classic relay: rows per batch")
	fs.DurationVar(&c.ClassicEvery, "classic-interval", c.ClassicEvery, "classic relay: polling interval")
}

func (c classicPolling) validate() error {
	if c.ClassicBatch < 1 || c.ClassicEvery <= 0 {
		return errors.New("classic-batch and classic-interval must be positive")
	}
	return nil
}

// keysVar, payloadVar, rateVar and workersVar register the flags that
// scenarios share outside the structs above.
func keysVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "keys", *p, "distinct correlation ids (0: the scenario's default)")
}

func payloadVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "payload", *p, "approximate JSON payload size in bytes")
}

func rateVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "rate", *p, "commits per second, orders per second in race (0: the scenario's default)")
}

func workersVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "workers", *p, "producer goroutines, one connection each")
}

func checkKeys(n int) error {
	if n < 0 {
		return fmt.Errorf("keys %d must not be negative", n)
	}
	return nil
}

func checkPayload(n int) error {
	if n < 0 || n > 1<<20 {
		return fmt.Errorf("payload %d out of range 0..1MiB", n)
	}
	return nil
}

func checkRate(n int) error {
	if n < 0 {
		return fmt.Errorf("rate %d must not be negative", n)
	}
	return nil
}

func checkWorkers(n int) error {
	if n < 1 || n > 32 {
		return fmt.Errorf("workers %d out of range 1..32", n)
	}
	return nil
}

// orDefault returns v, or def when v was left at 0 (-keys, -rate).
func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
