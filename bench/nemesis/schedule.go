package nemesis

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// The nemesis profiles.
const (
	ProfileShort = "short" // every kind once: about 2 minutes in all
	ProfileLong  = "long"  // rounds of every kind, with longer holds, until 10 minutes are planned
)

// longMinimum is the least time the long profile's steps take: the sum
// of their holds and rests.
const longMinimum = 10 * time.Minute

// sourceLinkWatchFrom is how long after a source-link cut the check on
// the other source starts: by then the cut node's leases of the cut
// source have lapsed (one TTL), and a node that wrongly stepped aside for
// the other source too has been left out of its map (its health window,
// 3/4 TTL, and the health hold, TTL/2) and handed it off.
const sourceLinkWatchFrom = 2 * nemesisTTL

// sourceLinkMinHold is the shortest source-link hold: sourceLinkWatchFrom
// and 2 s more in which the other source must be seen relaying on the cut
// node (isolationCheck).
const sourceLinkMinHold = sourceLinkWatchFrom + 2*time.Second

// nemesisTTL is the nodes' lease TTL (ORDO_LEASE_TTL): the holds of the
// pause are drawn as multiples of it.
const nemesisTTL = 2 * time.Second

// Kind is one kind of fault.
type Kind string

// The kinds of fault, in the order the plan shuffles them from.
const (
	kindKill          Kind = "kill"           // kill -9 one node, restart it after the hold
	kindPause         Kind = "pause"          // SIGSTOP one node for longer than its lease, then SIGCONT
	kindBrokerRestart Kind = "broker-restart" // rabbitmqctl stop_app, hold, start_app
	kindBrokerClose   Kind = "broker-close"   // rabbitmqctl close_connection of one node's or every node's connection
	kindPGTerminate   Kind = "pg-terminate"   // pg_terminate_backend of one node's or every node's sessions
	kindPGRestart     Kind = "pg-restart"     // pg_ctlcluster stop, hold, start
	kindGossipSplit   Kind = "gossip-split"   // one node cut off from the others' gossip (UDP and TCP), then healed
	kindAMQPLink      Kind = "amqp-link"      // one node's broker link cut or stalled (its proxy), then restored
	kindPGLink        Kind = "pg-link"        // one node's database link cut or stalled (its proxy), then restored
	kindMemoryAlarm   Kind = "memory-alarm"   // the broker's memory watermark set tiny, then restored
	kindHostileRow    Kind = "hostile-row"    // a row whose headers exceed frame_max, on a live key; skipped once parked
	kindPoison        Kind = "poison"         // rows the broker returns or whose exchange is missing, on live keys; skipped once parked
	kindSourceLink    Kind = "source-link"    // two sources: one node's link to one source's database cut or stalled; the other source must keep relaying on it

	// The consumer scenario's own kinds (it also runs kill, pause,
	// broker-restart, broker-close, pg-restart and pg-link, aimed at the
	// shipping instances and their database).
	kindRebalance   Kind = "rebalance"    // one instance stopped (it leaves: its shards move), started again after the hold (it joins)
	kindPoisonOrder Kind = "poison-order" // an order whose handler fails on every attempt: dead-lettered, its key held
	kindRedeliver   Kind = "redeliver"    // handled rows' marks undone: the relay republishes them (same ids and headers), the instances must drop them
)

// allKinds lists every kind once.
var allKinds = []Kind{kindKill, kindPause, kindBrokerRestart, kindBrokerClose, kindPGTerminate, kindPGRestart,
	kindGossipSplit, kindAMQPLink, kindPGLink, kindMemoryAlarm, kindHostileRow, kindPoison}

// sourceKinds lists the kinds only a run with two sources has.
var sourceKinds = []Kind{kindSourceLink}

// consumerKinds lists every kind of the consumer scenario once.
var consumerKinds = []Kind{kindKill, kindPause, kindBrokerRestart, kindBrokerClose, kindPGRestart, kindPGLink,
	kindRebalance, kindPoisonOrder, kindRedeliver}

// consumerOnlyKinds lists the consumer scenario's kinds the relay's does
// not run.
var consumerOnlyKinds = []Kind{kindRebalance, kindPoisonOrder, kindRedeliver}

// Variants of a step.
const (
	variantCut   = "cut"   // links: every connection reset, new ones refused
	variantStall = "stall" // links: every byte held back (a blackhole), released at the heal
	variantOne   = "one"   // broker-close, pg-terminate: one node's
	variantAll   = "all"   // broker-close, pg-terminate: every node's
)

// plannedStep is one fault of the schedule.
type plannedStep struct {
	N       int // 1-based position
	Kind    Kind
	Target  int           // node slot (0-based), or -1 when the step acts on every node or none
	Hold    time.Duration // how long the fault lasts before its heal (0: healed at once, or when its condition holds)
	Variant string        // see the variant constants; empty when the kind has none
	Source  int           // source-link: the index of the source whose link is cut (sourceNames)
	Quiet   time.Duration // pause after the recovery, before the next step
}

// holdRange is a kind's hold, drawn uniformly in [min, max].
type holdRange struct{ min, max time.Duration }

// holds returns each kind's hold range under a profile.
func holds(profile string) map[Kind]holdRange {
	s := time.Second
	if profile == ProfileLong {
		return map[Kind]holdRange{
			kindKill: {s / 2, 10 * s}, kindPause: {5 * nemesisTTL / 2, 6 * nemesisTTL},
			kindBrokerRestart: {0, 10 * s}, kindPGRestart: {0, 8 * s}, kindGossipSplit: {3 * s, 20 * s},
			kindAMQPLink: {s, 15 * s}, kindPGLink: {s, 15 * s}, kindMemoryAlarm: {2 * s, 15 * s},
			kindRebalance: {s, 15 * s}, kindSourceLink: {sourceLinkMinHold, 15 * s},
		}
	}
	return map[Kind]holdRange{
		kindKill: {s / 2, 3 * s}, kindPause: {5 * nemesisTTL / 2, 7 * nemesisTTL / 2},
		kindBrokerRestart: {0, 2 * s}, kindPGRestart: {0, 2 * s}, kindGossipSplit: {3 * s, 6 * s},
		kindAMQPLink: {2 * s, 5 * s}, kindPGLink: {2 * s, 5 * s}, kindMemoryAlarm: {2 * s, 4 * s},
		kindRebalance: {s, 4 * s}, kindSourceLink: {sourceLinkMinHold, 8 * s},
	}
}

// overhead is a rough cost of a kind beyond its hold (the commands, the
// recovery, the wait for convergence), for the plan's time estimate only.
func overhead(k Kind) time.Duration {
	switch k {
	case kindBrokerRestart:
		return 8 * time.Second
	case kindPause, kindPGRestart, kindGossipSplit:
		return 5 * time.Second
	default:
		return 4 * time.Second
	}
}

// estimate is the plan's rough wall time for s.
func (s plannedStep) estimate() time.Duration { return s.Hold + overhead(s.Kind) + s.Quiet }

// floor is the least wall time s can take: its hold and its rest.
func (s plannedStep) floor() time.Duration { return s.Hold + s.Quiet }

// planSchedule draws the schedule for seed and profile over nodes node
// slots. The same seed, profile and node count always give the same plan
// (math/rand/v2's PCG, seeded from seed alone). short runs every kind once
// in a shuffled order; long runs shuffled rounds of every kind until the
// steps' holds and rests alone add up to longMinimum, so that the run
// lasts at least that long however quickly each fault heals.
func planSchedule(seed int64, profile string, nodes int) ([]plannedStep, error) {
	return planKinds(seed, profile, nodes, allKinds)
}

// planKinds is planSchedule over the given kinds (a scenario's list).
func planKinds(seed int64, profile string, nodes int, all []Kind) ([]plannedStep, error) {
	if profile != ProfileShort && profile != ProfileLong {
		return nil, fmt.Errorf("profile %q: want %s or %s", profile, ProfileShort, ProfileLong)
	}
	if nodes < 2 {
		return nil, fmt.Errorf("a schedule needs at least 2 nodes, not %d", nodes)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6e656d65736973)) // "nemesis"
	hr := holds(profile)
	var plan []plannedStep
	var floor time.Duration
	for round := 0; round == 0 || (profile == ProfileLong && floor < longMinimum); round++ {
		kinds := append([]Kind(nil), all...)
		rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		for _, k := range kinds {
			if profile == ProfileLong && floor >= longMinimum {
				break
			}
			s := drawStep(rng, k, hr[k], profile, nodes)
			s.N = len(plan) + 1
			plan = append(plan, s)
			floor += s.floor()
		}
	}
	return plan, nil
}

// drawStep draws one step of kind k.
func drawStep(rng *rand.Rand, k Kind, hold holdRange, profile string, nodes int) plannedStep {
	s := plannedStep{Kind: k, Target: rng.IntN(nodes), Quiet: time.Second}
	if hold.max > hold.min {
		s.Hold = hold.min + time.Duration(rng.Int64N(int64(hold.max-hold.min)))
	} else {
		s.Hold = hold.min
	}
	s.Hold = s.Hold.Round(100 * time.Millisecond)
	if profile == ProfileLong {
		s.Quiet = time.Second + time.Duration(rng.IntN(30))*100*time.Millisecond
	}
	switch k {
	case kindAMQPLink, kindPGLink:
		s.Variant = pick(rng, variantCut, variantStall)
	case kindSourceLink:
		s.Variant = pick(rng, variantCut, variantStall)
		s.Source = rng.IntN(len(sourceNames))
	case kindBrokerClose, kindPGTerminate:
		s.Variant = pick(rng, variantOne, variantAll)
		if s.Variant == variantAll {
			s.Target = -1
		}
	case kindBrokerRestart, kindPGRestart, kindMemoryAlarm, kindHostileRow, kindPoison, kindPoisonOrder, kindRedeliver:
		s.Target = -1
	}
	return s
}

// ParseKinds parses -kinds: "all" (nil: every kind of the scenario) or
// comma-separated kinds.
func ParseKinds(s string) ([]Kind, error) {
	if s == "all" {
		return nil, nil // every kind of the scenario
	}
	var out []Kind
	for _, f := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(f))
		if !slices.Contains(allKinds, k) && !slices.Contains(sourceKinds, k) && !slices.Contains(consumerKinds, k) {
			return nil, fmt.Errorf("-kinds: unknown kind %q (kinds: %s)", k, kindList())
		}
		out = append(out, k)
	}
	return out, nil
}

func kindList() string {
	return strings.ReplaceAll(joinKinds(allKinds)+","+joinKinds(sourceKinds)+","+joinKinds(consumerOnlyKinds), ",", ", ")
}

// joinKinds writes kinds as -kinds takes them.
func joinKinds(kinds []Kind) string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ",")
}

// onlyKinds keeps the steps of plan whose kind is in kinds, numbered as
// planned.
func onlyKinds(plan []plannedStep, kinds []Kind) []plannedStep {
	var out []plannedStep
	for _, s := range plan {
		if slices.Contains(kinds, s.Kind) {
			out = append(out, s)
		}
	}
	return out
}

func pick(rng *rand.Rand, options ...string) string { return options[rng.IntN(len(options))] }

// targets returns how many nodes s acts on (every node when Target is -1).
func (s plannedStep) targets(nodes int) int {
	if s.Target < 0 {
		return nodes
	}
	return 1
}

// describe returns the step as printed: "kill n2 (hold 1.5s)".
func (s plannedStep) describe(names []string) string {
	d := string(s.Kind)
	if s.Variant != "" && s.Variant != variantAll && s.Variant != variantOne {
		d += " " + s.Variant
	}
	switch {
	case s.Kind == kindSourceLink && s.Target >= 0 && s.Target < len(names):
		d += " " + names[s.Target] + " to " + sourceNames[s.Source]
	case s.Target >= 0 && s.Target < len(names):
		d += " " + names[s.Target]
	case s.Kind == kindBrokerClose || s.Kind == kindPGTerminate:
		d += " every node"
	}
	if s.Hold > 0 {
		d += fmt.Sprintf(" (hold %v)", s.Hold)
	}
	return d
}

// printPlan writes the whole plan, one step a line.
func printPlan(w io.Writer, seed int64, profile string, plan []plannedStep, names []string) {
	var total time.Duration
	for _, s := range plan {
		total += s.estimate()
	}
	fmt.Fprintf(w, "nemesis plan: seed=%d profile=%s, %d steps, about %v of faults\n", seed, profile, len(plan), total.Round(time.Second))
	for _, s := range plan {
		fmt.Fprintf(w, "  %2d. %s\n", s.N, s.describe(names))
	}
}
