package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/internal/childproc"
)

const (
	// NodeStopTimeout bounds a node's graceful stop: its settle timeout
	// (5 s) plus lease release and slack. After it the node is killed.
	NodeStopTimeout = 20 * time.Second
	// nodeLogLines is how many of a node's output lines are kept.
	nodeLogLines = 2000
	// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times; 100
	// on every Linux the bench runs on.
	ClockTicks = 100
	// nodePkg is the node's main package, built by the test kit.
	nodePkg = "github.com/ordo-relay/ordo/cmd/node"
	// NodeBuildTag is the build tag the bench builds the node with: only
	// such a node reads the bench's switches from its environment
	// (ORDO_BENCH_UNSHARED_BUDGET, cmd/node's benchhook.go). A prebuilt
	// -node-bin needs it for the sources scenario's unshared runs.
	NodeBuildTag = "ordobench"
)

// NodeBinary returns the node binary: -node-bin, or ./cmd/node built once
// per bench process by childproc.Build with the NodeBuildTag (see
// childproc.RemoveBinaries).
func NodeBinary(ctx context.Context, o Config) (string, error) {
	if o.NodeBin != "" {
		return o.NodeBin, nil
	}
	if err := inModule(ctx); err != nil {
		return "", err
	}
	bin, took, err := childproc.Build(ctx, nodePkg, "-tags", NodeBuildTag)
	if err != nil {
		return "", err
	}
	if took > 0 {
		fmt.Printf("built the node in %v\n", took.Round(time.Millisecond))
	}
	return bin, nil
}

// inModule checks that the bench runs inside the ordo module, where go
// build finds the node's package.
func inModule(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	if mod := strings.TrimSpace(string(out)); mod == "" || mod == os.DevNull {
		return errors.New("not inside the ordo module: run the bench from the repository (go run ./bench)")
	}
	return nil
}

// Node is a running Node binary: a test-kit process with the Node's HTTP
// address. Its methods are safe for concurrent use.
type Node struct {
	Name     string
	HTTPAddr string
	Started  time.Time
	Proc     *childproc.Process
	stopping sync.Once
	stopErr  error
	took     time.Duration

	endMu sync.Mutex
	ended bool // stop or kill was called: exiting is not a failure
}

// StartProcess starts the node binary as a child in its own process group (so
// a Ctrl-C reaches only the bench, which then stops the node in order) with
// Pdeathsig SIGKILL (so it dies with the bench). Its output is printed with
// a "[name]" prefix and its last nodeLogLines lines kept. env adds or
// overrides ORDO_* variables (gossip settings, say). An empty dbURL, or
// an env that sets ORDO_SOURCES (the node's sources), sets no
// ORDO_POSTGRES_URL: the node refuses it together with ORDO_SOURCES.
func StartProcess(ctx context.Context, o Config, name, dbURL, amqpURL string, env ...string) (*Node, error) {
	bin, err := NodeBinary(ctx, o)
	if err != nil {
		return nil, err
	}
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	n := &Node{Name: name, HTTPAddr: addr, Started: time.Now()}
	prefix := "[" + name + "] "
	base := []string{
		"ORDO_AMQP_URL=" + amqpURL,
		"ORDO_NODE_NAME=" + name,
		"ORDO_HTTP_ADDR=" + addr,
		"ORDO_CONFIRM_WINDOW=" + strconv.Itoa(o.ConfirmWindow),
		"ORDO_PARTITIONS=" + strconv.Itoa(o.Partitions),
	}
	if dbURL != "" && !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "ORDO_SOURCES=") }) {
		base = append(base, "ORDO_POSTGRES_URL="+dbURL)
	}
	n.Proc, err = childproc.Start(name, bin, nil, childproc.Options{
		Env:       append(base, env...),
		OwnGroup:  true,
		KeepLines: nodeLogLines,
		Echo:      func(l string) { fmt.Fprintln(os.Stderr, prefix+l) },
	})
	if err != nil {
		return nil, fmt.Errorf("start node %s: %w", name, err)
	}
	return n, nil
}

// FreeAddr returns 127.0.0.1:<a port free for TCP and UDP just now>.
func FreeAddr() (string, error) { return childproc.PickAddr() }

// Pid returns the node's process id.
func (n *Node) Pid() int { return n.Proc.Pid() }

// Exited reports whether the process has Exited.
func (n *Node) Exited() bool { return n.Proc.Exited() }

// Failed returns an error when the node has exited without being stopped
// or killed; nil while it runs.
func (n *Node) Failed() error {
	if !n.Exited() || n.endedOnPurpose() {
		return nil
	}
	code, err := n.Proc.Wait(0)
	return fmt.Errorf("node %s exited early (code %d, %v); last output:\n%s", n.Name, code, err, n.Proc.Tail(20))
}

// WaitReady polls /readyz until it answers 200: the node is connected to
// both servers and holds at least one lease.
func (n *Node) WaitReady(ctx context.Context, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	url := "http://" + n.HTTPAddr + "/readyz"
	return WaitUntil(ctx, timeout, 50*time.Millisecond, "node "+n.Name+" ready", func() (bool, error) {
		if err := n.Failed(); err != nil {
			return false, err
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, nil // not listening yet
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// Kill sends SIGKILL to the node's process (only it, not its group) and
// waits until it has exited. A killed node is not a failure: failed and
// stop return nil for it.
func (n *Node) Kill() {
	n.markEnded()
	n.Proc.Kill()
	<-n.Proc.Done()
}

func (n *Node) markEnded() {
	n.endMu.Lock()
	n.ended = true
	n.endMu.Unlock()
}

func (n *Node) endedOnPurpose() bool {
	n.endMu.Lock()
	defer n.endMu.Unlock()
	return n.ended
}

// Stop sends SIGTERM and waits up to timeout for a graceful exit, then
// kills the node. It returns how long the graceful Stop took. Calling it
// again returns the first call's error.
func (n *Node) Stop(timeout time.Duration) (time.Duration, error) {
	n.stopping.Do(func() {
		if n.Exited() {
			n.stopErr = n.Failed()
			return
		}
		n.markEnded()
		start := time.Now()
		code, err := n.Proc.Stop(timeout)
		switch {
		case err != nil:
			n.stopErr = fmt.Errorf("node %s: %w; last output:\n%s", n.Name, err, n.Proc.Tail(20))
		case code != 0:
			n.stopErr = fmt.Errorf("node %s exited with code %d; last output:\n%s", n.Name, code, n.Proc.Tail(20))
		default:
			n.took = time.Since(start)
		}
	})
	return n.took, n.stopErr
}

// procStatus returns a field of /proc/<pid>/status in kB (VmHWM, VmRSS).
func (n *Node) procStatus(field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.Pid()))
	if err != nil {
		return 0, fmt.Errorf("node status: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("node status: no %s", field)
}

// PeakRSSMiB returns the node's peak resident set size (VmHWM) in MiB.
// Call it before stop.
func (n *Node) PeakRSSMiB() (float64, error) {
	kb, err := n.procStatus("VmHWM")
	return float64(kb) / 1024, err
}

// CPU returns the CPU time (user + system) the node has used so far.
// Call it before stop.
func (n *Node) CPU() (time.Duration, error) {
	return ProcCPU(n.Pid())
}

// ProcCPU returns the user + system CPU time of process pid.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("process %d stat: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after the last ')'. utime and stime are fields 14, 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("process %d stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("process %d stat: malformed", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("process %d stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / ClockTicks, nil
}

// LineAfter returns the time of the first output line at or after t that
// contains substr.
func (n *Node) LineAfter(substr string, t time.Time) (time.Time, bool) {
	return n.Proc.LineAfter(substr, t)
}

// Metric returns the sum of every sample of the counter or gauge name on
// the node's /metrics (every label set), and whether the page had it.
func (n *Node) Metric(ctx context.Context, name string) (float64, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTPAddr+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("node %s metrics: %w", n.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("node %s metrics: %s", n.Name, resp.Status)
	}
	return sumSamples(resp.Body, name)
}

// sumSamples sums the samples of metric name in a Prometheus text page.
func sumSamples(page io.Reader, name string) (float64, bool, error) {
	var sum float64
	found := false
	sc := bufio.NewScanner(page)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("metric line without a value: %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	return sum, found, sc.Err()
}
