package measure

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

// Distribution summarises durations.
type Distribution struct {
	n                                   int
	min, P50, p90, P99, p999, max, mean time.Duration
}

func DistributionOf(ds []time.Duration) Distribution {
	if len(ds) == 0 {
		return Distribution{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Distribution{
		n: len(s), min: s[0], max: s[len(s)-1], mean: sum / time.Duration(len(s)),
		P50: result.Percentile(s, 0.50), p90: result.Percentile(s, 0.90), P99: result.Percentile(s, 0.99), p999: result.Percentile(s, 0.999),
	}
}

// AddTo adds the distribution to r as figures named prefix_p50 etc., in
// milliseconds.
func (d Distribution) AddTo(r *result.Result, prefix string) {
	r.Millis(prefix+"_p50", d.P50)
	r.Millis(prefix+"_p90", d.p90)
	r.Millis(prefix+"_p99", d.P99)
	r.Millis(prefix+"_p999", d.p999)
	r.Millis(prefix+"_max", d.max)
	r.Millis(prefix+"_min", d.min)
	r.Millis(prefix+"_mean", d.mean)
}

// CPUSample is CPU time used so far, by the servers the bench drives and
// by the bench itself, to show where a run's time goes. Servers are found
// by process name in /proc (postgres, beam.smp); other users of the same
// servers (tests running alongside) are counted too, so treat the figures
// as an upper bound. Processes that exit between two samples drop out.
type CPUSample struct {
	At      time.Time
	ByComm  map[string]map[int]time.Duration // comm -> pid -> CPU
	Self    time.Duration
	Machine time.Duration // all CPUs, busy time, from /proc/stat
}

// cpuComms are the process names a CPUSample counts.
var cpuComms = []string{"postgres", "beam.smp"}

func SampleCPU() CPUSample {
	s := CPUSample{At: time.Now(), ByComm: map[string]map[int]time.Duration{}}
	for _, c := range cpuComms {
		s.ByComm[c] = map[int]time.Duration{}
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
		m, ok := s.ByComm[strings.TrimSpace(string(comm))]
		if !ok {
			continue
		}
		if t, err := harness.ProcCPU(pid); err == nil {
			m[pid] = t
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.Self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.Machine = machineBusy()
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

// AddCPU adds, for the window between start and end, the CPU seconds of
// each server, of the bench and of the whole machine, and the machine's
// busy share.
func AddCPU(r *result.Result, start, end CPUSample, prefix string) {
	for _, c := range cpuComms {
		var d time.Duration
		for pid, t := range end.ByComm[c] {
			d += t - start.ByComm[c][pid] // a new process counts from 0
		}
		name := strings.TrimSuffix(c, ".smp")
		if name == "beam" {
			name = "rabbitmq"
		}
		r.Seconds(prefix+"cpu_"+name, d)
	}
	r.Seconds(prefix+"cpu_bench", end.Self-start.Self)
	busy := end.Machine - start.Machine
	r.Seconds(prefix+"cpu_machine", busy)
	if wall := end.At.Sub(start.At); wall > 0 && busy > 0 {
		r.Figure(prefix+"machine_busy", 100*busy.Seconds()/(wall.Seconds()*float64(runtime.NumCPU())), "%")
	}
	r.Seconds(prefix+"cpu_window_seconds", end.At.Sub(start.At))
}

// Thousands formats n with commas: 12,345.
func Thousands(n int64) string {
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
