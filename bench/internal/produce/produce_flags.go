package produce

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"
)

// Options are the produce scenario's: -payload, -keys and its
// -produce-* flags.
type Options struct {
	measure.Common
	Payload int          // approximate payload size in bytes
	Keys    int          // distinct correlation ids (0: 10000)
	Produce produceFlags // its -produce-* flags
}

func DefaultOptions() Options {
	return Options{Payload: 300, Produce: defaultProduceFlags()}
}

func (o *Options) AddFlags(fs *flag.FlagSet) {
	measure.PayloadVar(fs, &o.Payload)
	measure.KeysVar(fs, &o.Keys)
	addProduceFlags(fs, &o.Produce)
}

func (o Options) Validate() error {
	return errors.Join(measure.CheckPayload(o.Payload), measure.CheckKeys(o.Keys), o.Produce.Validate())
}

// produceFlags are the produce scenario's flags.
type produceFlags struct {
	Duration   time.Duration // measured time per run
	Warmup     time.Duration // time per run before measuring starts
	Producers  []int         // producer counts, one cell each
	Rows       []int         // rows per transaction, one cell each
	Reps       int           // repetitions of every (cell, variant)
	Variants   []string      // variants to run; classic always first
	WALInspect bool          // measure this database's WAL with pg_walinspect
	Rate       int           // transactions a second over all producers (produce_pace.go); 0: closed loop
	Sleep      time.Duration // pg_sleep in every transaction after its inserts (the hot-key cell: a transaction that holds its key a while)
}

// defaultProduceFlags returns the produce scenario's defaults.
func defaultProduceFlags() produceFlags {
	all, _ := parseProduceVariants("all")
	return produceFlags{Duration: 10 * time.Second, Warmup: time.Second, Producers: []int{1, 8, 32}, Rows: []int{1, 10},
		Reps: 3, Variants: all, WALInspect: true}
}

// addProduceFlags registers the produce scenario's -produce-* flags on fs,
// with p's values as their defaults.
func addProduceFlags(fs *flag.FlagSet, p *produceFlags) {
	fs.DurationVar(&p.Duration, "produce-duration", p.Duration, "measured time per run")
	fs.DurationVar(&p.Warmup, "produce-warmup", p.Warmup, "time per run before measuring starts")
	measure.ListVar(fs, "produce-producers", measure.JoinInts(p.Producers), "comma-separated producer counts (connections), 1 to 64", func(s string) (err error) {
		p.Producers, err = ParseRange("produce-producers", s, 1, 64)
		return err
	})
	measure.ListVar(fs, "produce-rows", measure.JoinInts(p.Rows), "comma-separated rows per transaction, 1 to 1000", func(s string) (err error) {
		p.Rows, err = ParseRange("produce-rows", s, 1, 1000)
		return err
	})
	fs.IntVar(&p.Reps, "produce-reps", p.Reps, "repetitions of every variant in every cell (alternating); medians are reported")
	measure.ListVar(fs, "produce-variants", "all", "comma-separated variants (classic, ordo-sql, ordo-sql-nonotify, ordo-enqueue, bare, ordo-sql-relay, ordo-lean, ordo-lean-relay, adopted-relay, classic-relay) or all; classic always runs", func(s string) (err error) {
		p.Variants, err = parseProduceVariants(s)
		return err
	})
	fs.IntVar(&p.Rate, "produce-rate", p.Rate, "paced: transactions a second over all producers, evenly spaced (0: each producer commits back to back)")
	fs.DurationVar(&p.Sleep, "produce-sleep", p.Sleep, "pg_sleep in every transaction after its inserts, before COMMIT (the hot-key cell: -keys 10 -produce-producers 32 -produce-sleep 2ms)")
	fs.BoolVar(&p.WALInspect, "produce-wal-inspect", p.WALInspect, "count the WAL of the run's own database with pg_walinspect (besides the server-wide LSN delta)")
}

func (p produceFlags) Validate() error {
	if p.Duration <= 0 || p.Warmup < 0 || p.Reps < 1 || p.Reps > 20 || p.Rate < 0 {
		return errors.New("produce-duration must be positive, produce-warmup and produce-rate not negative, produce-reps 1..20")
	}
	return nil
}

// ParseRange parses "1,8,32" into counts from lo to hi.
func ParseRange(flagName, s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("-%s %q: want comma-separated counts from %d to %d", flagName, s, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}
