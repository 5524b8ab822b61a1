package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// buildTimeout bounds go build of the node.
	buildTimeout = 5 * time.Minute
	// nodeStopTimeout bounds a node's graceful stop: its settle timeout
	// (5 s) plus lease release and slack. After it the node is killed.
	nodeStopTimeout = 20 * time.Second
	// nodeLogLines is how many of a node's output lines are kept.
	nodeLogLines = 2000
	// clockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times; 100
	// on every Linux the bench runs on.
	clockTicks = 100
)

var built struct {
	mu  sync.Mutex
	dir string // temporary directory holding the binary
	bin string
}

// nodeBinary returns the node binary: -node-bin, or ./cmd/node built once
// per bench process into a temporary directory (see removeBinaries).
func nodeBinary(ctx context.Context, o options) (string, error) {
	if o.NodeBin != "" {
		return o.NodeBin, nil
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.bin != "" {
		return built.bin, nil
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "ordo-bench-bin-")
	if err != nil {
		return "", fmt.Errorf("build node: %w", err)
	}
	bin := filepath.Join(dir, "node")
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(bctx, "go", "build", "-o", bin, "./cmd/node")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("go build ./cmd/node: %w\n%s", err, out)
	}
	fmt.Printf("built the node in %v\n", time.Since(start).Round(time.Millisecond))
	built.dir, built.bin = dir, bin
	return bin, nil
}

// moduleRoot returns the directory of the main module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the ordo module: run the bench from the repository (go run ./bench)")
	}
	return filepath.Dir(mod), nil
}

// removeBinaries deletes the directory nodeBinary built into.
func removeBinaries() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	built.dir, built.bin = "", ""
}

// node is a running node binary. Its methods are safe for concurrent use.
type node struct {
	name     string
	httpAddr string
	cmd      *exec.Cmd
	started  time.Time
	done     chan struct{} // closed when the process has exited
	waitErr  error         // set before done is closed
	log      *nodeLog
	stopping sync.Once
	stopErr  error

	endMu sync.Mutex
	ended bool // stop or kill was called: exiting is not a failure
}

// startNode starts the node binary as a child in its own process group (so
// a Ctrl-C reaches only the bench, which then stops the node in order) with
// Pdeathsig SIGKILL (so it dies with the bench). Its output is printed with
// a "[name]" prefix and kept for logLines. env adds or overrides ORDO_*
// variables (gossip settings, say).
func startNode(ctx context.Context, o options, name, dbURL, amqpURL string, env ...string) (*node, error) {
	bin, err := nodeBinary(ctx, o)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	n := &node{name: name, httpAddr: addr, done: make(chan struct{}), log: &nodeLog{prefix: "[" + name + "] "}}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"ORDO_POSTGRES_URL="+dbURL,
		"ORDO_AMQP_URL="+amqpURL,
		"ORDO_NODE_NAME="+name,
		"ORDO_HTTP_ADDR="+addr,
		"ORDO_CONFIRM_WINDOW="+strconv.Itoa(o.ConfirmWindow),
		"ORDO_PARTITIONS="+strconv.Itoa(o.Partitions),
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// One writer for both streams: exec then copies them from one pipe.
	cmd.Stdout = n.log
	cmd.Stderr = n.log
	cmd.WaitDelay = 2 * time.Second
	n.cmd = cmd
	n.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node %s: %w", name, err)
	}
	go func() {
		n.waitErr = cmd.Wait()
		n.log.flush()
		close(n.done)
	}()
	return n, nil
}

// freeAddr returns 127.0.0.1:<a port free just now>.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr, nil
}

// pid returns the node's process id.
func (n *node) pid() int { return n.cmd.Process.Pid }

// exited reports whether the process has exited.
func (n *node) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// failed returns an error when the node has exited without being stopped
// or killed; nil while it runs.
func (n *node) failed() error {
	if !n.exited() || n.endedOnPurpose() {
		return nil
	}
	return fmt.Errorf("node %s exited early (%v); last output:\n%s", n.name, n.waitErr, n.log.tail(20))
}

// waitReady polls /readyz until it answers 200: the node is connected to
// both servers and holds at least one lease.
func (n *node) waitReady(ctx context.Context, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	url := "http://" + n.httpAddr + "/readyz"
	return waitUntil(ctx, timeout, 50*time.Millisecond, "node "+n.name+" ready", func() (bool, error) {
		if err := n.failed(); err != nil {
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

// kill sends SIGKILL to the node's process (only it, not its group) and
// waits until it has exited. A killed node is not a failure: failed and
// stop return nil for it.
func (n *node) kill() {
	n.markEnded()
	_ = n.cmd.Process.Kill()
	<-n.done
}

func (n *node) markEnded() {
	n.endMu.Lock()
	n.ended = true
	n.endMu.Unlock()
}

func (n *node) endedOnPurpose() bool {
	n.endMu.Lock()
	defer n.endMu.Unlock()
	return n.ended
}

// stop sends SIGTERM and waits up to timeout for a graceful exit, then
// kills the node. It returns how long the graceful stop took. Calling it
// again returns the first call's error.
func (n *node) stop(timeout time.Duration) (time.Duration, error) {
	var took time.Duration
	n.stopping.Do(func() {
		start := time.Now()
		if n.exited() {
			n.stopErr = n.failed()
			return
		}
		n.markEnded()
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-n.done:
			took = time.Since(start)
			if n.waitErr != nil {
				n.stopErr = fmt.Errorf("node %s: %w; last output:\n%s", n.name, n.waitErr, n.log.tail(20))
			}
		case <-t.C:
			_ = n.cmd.Process.Kill()
			<-n.done
			n.stopErr = fmt.Errorf("node %s did not stop within %v after SIGTERM; killed", n.name, timeout)
		}
	})
	return took, n.stopErr
}

// procStatus returns a field of /proc/<pid>/status in kB (VmHWM, VmRSS).
func (n *node) procStatus(field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.pid()))
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

// peakRSSMiB returns the node's peak resident set size (VmHWM) in MiB.
// Call it before stop.
func (n *node) peakRSSMiB() (float64, error) {
	kb, err := n.procStatus("VmHWM")
	return float64(kb) / 1024, err
}

// cpu returns the CPU time (user + system) the node has used so far.
// Call it before stop.
func (n *node) cpu() (time.Duration, error) {
	return procCPU(n.pid())
}

// procCPU returns the user + system CPU time of process pid.
func procCPU(pid int) (time.Duration, error) {
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
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// lineAfter returns the time of the first output line at or after t that
// contains substr.
func (n *node) lineAfter(substr string, t time.Time) (time.Time, bool) {
	return n.log.find(substr, t)
}

// nodeLog receives a node's output, prints it line by line with a prefix
// and keeps the last nodeLogLines lines with their arrival times. exec
// calls Write from one goroutine; find and tail may run concurrently.
type nodeLog struct {
	prefix string

	mu      sync.Mutex
	partial []byte
	lines   []logLine
}

type logLine struct {
	at   time.Time
	text string
}

func (l *nodeLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.addLocked(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	l.partial = append([]byte(nil), l.partial...)
	return len(b), nil
}

func (l *nodeLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.addLocked(string(l.partial))
		l.partial = nil
	}
}

func (l *nodeLog) addLocked(text string) {
	fmt.Fprintln(os.Stderr, l.prefix+text)
	if len(l.lines) == nodeLogLines {
		copy(l.lines, l.lines[1:])
		l.lines = l.lines[:nodeLogLines-1]
	}
	l.lines = append(l.lines, logLine{time.Now(), text})
}

func (l *nodeLog) find(substr string, after time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.lines {
		if !ln.at.Before(after) && strings.Contains(ln.text, substr) {
			return ln.at, true
		}
	}
	return time.Time{}, false
}

func (l *nodeLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, ln := range l.lines[max(0, len(l.lines)-n):] {
		b.WriteString("  " + ln.text + "\n")
	}
	return b.String()
}
