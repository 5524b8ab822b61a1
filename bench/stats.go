package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// distribution summarises durations.
type distribution struct {
	n                                   int
	min, p50, p90, p99, p999, max, mean time.Duration
}

func distributionOf(ds []time.Duration) distribution {
	if len(ds) == 0 {
		return distribution{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return distribution{
		n: len(s), min: s[0], max: s[len(s)-1], mean: sum / time.Duration(len(s)),
		p50: result.Percentile(s, 0.50), p90: result.Percentile(s, 0.90), p99: result.Percentile(s, 0.99), p999: result.Percentile(s, 0.999),
	}
}

// addTo adds the distribution to r as figures named prefix_p50 etc., in
// milliseconds.
func (d distribution) addTo(r *result.Result, prefix string) {
	r.Millis(prefix+"_p50", d.p50)
	r.Millis(prefix+"_p90", d.p90)
	r.Millis(prefix+"_p99", d.p99)
	r.Millis(prefix+"_p999", d.p999)
	r.Millis(prefix+"_max", d.max)
	r.Millis(prefix+"_min", d.min)
	r.Millis(prefix+"_mean", d.mean)
}

// cpuSample is CPU time used so far, by the servers the bench drives and
// by the bench itself, to show where a run's time goes. Servers are found
// by process name in /proc (postgres, beam.smp); other users of the same
// servers (tests running alongside) are counted too, so treat the figures
// as an upper bound. Processes that exit between two samples drop out.
type cpuSample struct {
	at      time.Time
	byComm  map[string]map[int]time.Duration // comm -> pid -> CPU
	self    time.Duration
	machine time.Duration // all CPUs, busy time, from /proc/stat
}

// cpuComms are the process names a cpuSample counts.
var cpuComms = []string{"postgres", "beam.smp"}

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now(), byComm: map[string]map[int]time.Duration{}}
	for _, c := range cpuComms {
		s.byComm[c] = map[int]time.Duration{}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil {
			continue
		}
		m, ok := s.byComm[strings.TrimSpace(string(comm))]
		if !ok {
			continue
		}
		if t, err := harness.ProcCPU(pid); err == nil {
			m[pid] = t
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.machine = machineBusy()
	return s
}

// machineBusy returns the busy time of all CPUs from /proc/stat (user,
// nice, system, irq, softirq, steal).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * time.Second / harness.ClockTicks
}

// addCPU adds, for the window between start and end, the CPU seconds of
// each server, of the bench and of the whole machine, and the machine's
// busy share.
func addCPU(r *result.Result, start, end cpuSample, prefix string) {
	for _, c := range cpuComms {
		var d time.Duration
		for pid, t := range end.byComm[c] {
			d += t - start.byComm[c][pid] // a new process counts from 0
		}
		name := strings.TrimSuffix(c, ".smp")
		if name == "beam" {
			name = "rabbitmq"
		}
		r.Seconds(prefix+"cpu_"+name, d)
	}
	r.Seconds(prefix+"cpu_bench", end.self-start.self)
	busy := end.machine - start.machine
	r.Seconds(prefix+"cpu_machine", busy)
	if wall := end.at.Sub(start.at); wall > 0 && busy > 0 {
		r.Figure(prefix+"machine_busy", 100*busy.Seconds()/(wall.Seconds()*float64(runtime.NumCPU())), "%")
	}
	r.Seconds(prefix+"cpu_window_seconds", end.at.Sub(start.at))
}

// thousands formats n with commas: 12,345.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
