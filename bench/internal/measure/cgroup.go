package measure

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
)

// CgroupRoot is where the CPU controller's hierarchy is mounted: cgroup
// v1 under CgroupRoot/cpu, cgroup v2 at CgroupRoot itself.
const CgroupRoot = "/sys/fs/cgroup"

// ErrNoCgroup is returned by NewCPUCaps when neither a cgroup v1 cpu
// hierarchy nor a cgroup v2 one with the cpu controller is writable here.
var ErrNoCgroup = errors.New("no writable CPU cgroup: scaleout caps every node with a cgroup and needs either " +
	"cgroup v1 with the cpu controller mounted at " + CgroupRoot + "/cpu, or cgroup v2 at " + CgroupRoot +
	" with the cpu controller available, writable by this user (run as root, or delegate a subtree)")

// CPUCaps is a parent cgroup of the bench's with one child per capped
// process, each with a hard CPU quota (CFS bandwidth control). close
// moves any process still inside back to the root group and removes
// every group; call it always.
type CPUCaps struct {
	Version int    // 1 or 2
	Parent  string // the bench's group: <hierarchy>/ordo_bench_<random>
	top     string // the hierarchy's root, where close moves leftovers
	Period  time.Duration
	cores   float64
	groups  []string // created children
}

// NewCPUCaps creates the bench's parent group under root (CgroupRoot in
// the bench; a test may pass another), preferring cgroup v1 where its cpu
// hierarchy is mounted, and cgroup v2 otherwise. Each child made by cap
// gets cores × period of CPU time per period.
func NewCPUCaps(root string, cores float64, period time.Duration) (*CPUCaps, error) {
	name := "ordo_bench_" + harness.RandomHex(4)
	period = CapPeriod(cores, period)
	v1 := filepath.Join(root, "cpu")
	if FileExists(filepath.Join(v1, "cpu.cfs_quota_us")) {
		c := &CPUCaps{Version: 1, Parent: filepath.Join(v1, name), top: v1, Period: period, cores: cores}
		if err := os.Mkdir(c.Parent, 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
		}
		return c, nil
	}
	if ctl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil && hasWord(string(ctl), "cpu") {
		c := &CPUCaps{Version: 2, Parent: filepath.Join(root, name), top: root, Period: period, cores: cores}
		// Children get cpu.max only if the parent's parent delegates cpu.
		if err := enableCPU(root); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
		}
		if err := os.Mkdir(c.Parent, 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
		}
		if err := enableCPU(c.Parent); err != nil {
			_ = os.Remove(c.Parent)
			return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
		}
		return c, nil
	}
	return nil, ErrNoCgroup
}

// enableCPU turns the cpu controller on for dir's children (cgroup v2).
func enableCPU(dir string) error {
	ctl, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err == nil && hasWord(string(ctl), "cpu") {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
		return fmt.Errorf("enable the cpu controller in %s: %w", dir, err)
	}
	return nil
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

func FileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// minQuota is the kernel's smallest CFS quota.
const minQuota = time.Millisecond

// CapPeriod returns period, or the shortest period at which cores of CPU
// is at least the kernel's minimum quota (0.05 core needs 20 ms).
func CapPeriod(cores float64, period time.Duration) time.Duration {
	if need := time.Duration(math.Ceil(float64(minQuota) / cores)); need > period {
		return need
	}
	return period
}

// Quota returns the CPU time per period for cores: at least 1 ms, the
// kernel's minimum.
func (c *CPUCaps) Quota() time.Duration {
	return max(minQuota, time.Duration(math.Round(c.cores*float64(c.Period))))
}

// Cap creates child group name, sets its quota and moves process pid
// (every thread of it: cgroup.procs, not tasks) into it.
func (c *CPUCaps) Cap(name string, pid int) error {
	dir, err := c.Group(name)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: write cgroup.procs: %w", dir, err)
	}
	return nil
}

// Group creates child group name with its quota, empty, and returns its
// directory: a process written to its cgroup.procs, and every process
// that one forks afterwards, is capped.
func (c *CPUCaps) Group(name string) (string, error) {
	dir := filepath.Join(c.Parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("cgroup %s: %w", dir, err)
	}
	c.groups = append(c.groups, dir)
	us := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
	var writes [][2]string
	if c.Version == 1 {
		// The period first: a quota above the old period's is refused.
		writes = [][2]string{{"cpu.cfs_period_us", us(c.Period)}, {"cpu.cfs_quota_us", us(c.Quota())}}
	} else {
		writes = [][2]string{{"cpu.max", us(c.Quota()) + " " + us(c.Period)}}
	}
	for _, w := range writes {
		if err := os.WriteFile(filepath.Join(dir, w[0]), []byte(w[1]), 0o644); err != nil {
			return "", fmt.Errorf("cgroup %s: write %s: %w", dir, w[0], err)
		}
	}
	return dir, nil
}

// Throttled returns the sum over the children of nr_throttled: periods in
// which a group used up its quota and was stopped until the next one.
func (c *CPUCaps) Throttled() (int64, error) {
	var n int64
	for _, g := range c.groups {
		b, err := os.ReadFile(filepath.Join(g, "cpu.stat"))
		if err != nil {
			return 0, fmt.Errorf("cgroup %s: %w", g, err)
		}
		n += ParseCPUStat(string(b))["nr_throttled"]
	}
	return n, nil
}

// ParseCPUStat parses a cpu.stat file ("key value" lines).
func ParseCPUStat(s string) map[string]int64 {
	m := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			m[f[0]] = v
		}
	}
	return m
}

// Close moves any process left in the children to the hierarchy's root
// and removes the children and the parent. It is idempotent.
func (c *CPUCaps) Close() error {
	var errs []error
	for _, g := range append(c.groups, c.Parent) {
		if b, err := os.ReadFile(filepath.Join(g, "cgroup.procs")); err == nil {
			for _, pid := range strings.Fields(string(b)) {
				_ = os.WriteFile(filepath.Join(c.top, "cgroup.procs"), []byte(pid), 0o644)
			}
		}
	}
	for i := len(c.groups) - 1; i >= 0; i-- {
		if err := removeGroup(c.groups[i]); err != nil {
			errs = append(errs, err)
		}
	}
	c.groups = nil
	if err := removeGroup(c.Parent); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeGroup removes an empty cgroup directory. The kernel refuses
// (EBUSY) until the last process that left it is fully gone, so it
// tries for up to cgroupRemoveTimeout.
func removeGroup(dir string) error {
	deadline := time.Now().Add(cgroupRemoveTimeout)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupRemoveTimeout bounds removeGroup's retries.
const cgroupRemoveTimeout = 5 * time.Second
