package testkit

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildTimeout bounds one go build.
const buildTimeout = 5 * time.Minute

// processWaitDelay bounds how long Wait keeps reading a child's output after
// the child has exited (a grandchild may still hold the pipes open).
const processWaitDelay = 2 * time.Second

var builds struct {
	mu      sync.Mutex
	dir     string // made with os.MkdirTemp on first use; see RemoveBinaries
	entries map[string]*buildEntry
}

type buildEntry struct {
	once sync.Once
	sub  string // the entry's own directory, so equal last elements do not clash
	bin  string
	err  error
}

// BuildBinary builds the main package pkg (an import path such as
// "github.com/ordo-relay/ordo/cmd/node", or a path relative to the test's
// directory such as "./testdata/x") with go build, without -race, and
// returns the binary's path. Each pkg is built once per test process and
// shared by every test; concurrent callers wait for the same build. It fails
// tb with the compiler's output when the build fails. Binaries live in one
// directory under os.TempDir for the whole process; RemoveBinaries deletes it.
func BuildBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	builds.mu.Lock()
	if builds.entries == nil {
		builds.entries = map[string]*buildEntry{}
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "ordo-testkit-bin-")
		if err != nil {
			builds.mu.Unlock()
			tb.Fatalf("build %s: %v", pkg, err)
		}
		builds.dir = dir
	}
	e := builds.entries[pkg]
	if e == nil {
		e = &buildEntry{sub: filepath.Join(builds.dir, strconv.Itoa(len(builds.entries)))}
		builds.entries[pkg] = e
	}
	builds.mu.Unlock()

	e.once.Do(func() {
		name := path.Base(filepath.ToSlash(pkg))
		if name == "." || name == "/" || name == "" {
			name = "main"
		}
		if err := os.MkdirAll(e.sub, 0o755); err != nil {
			e.err = fmt.Errorf("build %s: %w", pkg, err)
			return
		}
		bin := filepath.Join(e.sub, name)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			e.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
			return
		}
		e.bin = bin
		tb.Logf("built %s in %v", pkg, time.Since(start).Round(time.Millisecond))
	})
	if e.err != nil {
		tb.Fatal(e.err)
	}
	return e.bin
}

// RemoveBinaries deletes the directory BuildBinary builds into. Call it from
// TestMain after the tests have run (for example from the Run method of a
// wrapper passed to goleak.VerifyTestMain); without it the directory is left
// in os.TempDir. Building again afterwards starts a new directory.
func RemoveBinaries() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
	builds.dir = ""
	builds.entries = nil
}

// Process is a child process started by StartProcess. Its methods are safe
// for concurrent use.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	// waitErr is set before done is closed.
	waitErr error

	mu      sync.Mutex
	tb      testing.TB // nil once the test has ended: output is no longer logged
	out     bytes.Buffer
	changed chan struct{} // closed and replaced when output arrives or the process exits
}

// StartProcess starts bin with args, the environment of the test process
// plus env ("K=V" entries, later ones win), and Pdeathsig set so that the
// child is killed if the test process dies. Each line the child prints on
// stdout or stderr is logged through tb.Logf with a "[name] " prefix while
// the test runs, and kept for Output and WaitOutput. When tb ends, a child
// still running is killed with SIGKILL and waited for.
//
// Pdeathsig follows the OS thread that started the child; the Go runtime
// does not end threads in normal operation, so in practice it follows the
// test process.
func StartProcess(tb testing.TB, name, bin string, args []string, env []string) *Process {
	tb.Helper()
	p := &Process{
		name:    name,
		done:    make(chan struct{}),
		tb:      tb,
		changed: make(chan struct{}),
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout = &lineWriter{p: p}
	cmd.Stderr = &lineWriter{p: p}
	cmd.WaitDelay = processWaitDelay
	p.cmd = cmd
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s (%s): %v", name, bin, err)
	}
	tb.Logf("started %s: pid %d: %s %s", name, cmd.Process.Pid, bin, strings.Join(args, " "))

	go func() {
		err := cmd.Wait()
		// exec has finished copying output: flush partial last lines.
		cmd.Stdout.(*lineWriter).flush()
		cmd.Stderr.(*lineWriter).flush()
		p.waitErr = err
		close(p.done)
		p.mu.Lock()
		p.notifyLocked()
		p.mu.Unlock()
	}()

	tb.Cleanup(func() {
		if !p.Exited() {
			p.Kill()
		}
		<-p.done
		p.mu.Lock()
		p.tb = nil
		p.mu.Unlock()
	})
	return p
}

// Pid returns the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the child has exited (and its output was read).
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the child. It returns os.ErrProcessDone when the child
// has already exited.
func (p *Process) Signal(sig os.Signal) error {
	if p.Exited() {
		return os.ErrProcessDone
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL to the child unless it has already exited. It does not
// wait: use Wait for that.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
}

// Wait waits up to timeout for the child to exit. It returns the exit code
// and a nil error when the child exited by itself; -1 and an error when it
// was ended by a signal (the error names it) or could not be waited for; and
// -1 and an error when timeout passes first, leaving the child running.
func (p *Process) Wait(timeout time.Duration) (exitCode int, err error) {
	if !p.Exited() {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			return -1, fmt.Errorf("%s (pid %d) still running after %v", p.name, p.Pid(), timeout)
		}
	}
	st := p.cmd.ProcessState
	if st == nil {
		return -1, fmt.Errorf("wait for %s: %w", p.name, p.waitErr)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, fmt.Errorf("%s (pid %d) terminated by signal %v", p.name, p.Pid(), ws.Signal())
	}
	if st.Exited() {
		return st.ExitCode(), nil
	}
	return -1, fmt.Errorf("wait for %s: %v", p.name, st)
}

// Output returns everything the child has printed so far, stdout and stderr
// interleaved line by line.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// WaitOutput waits until substr has appeared in the child's output and logs
// how long that took. It fails tb when timeout passes first or the child
// exits without printing it.
func (p *Process) WaitOutput(tb testing.TB, substr string, timeout time.Duration) {
	tb.Helper()
	start := time.Now()
	if err := p.AwaitOutput(substr, timeout); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("%s printed %q after %v", p.name, substr, time.Since(start).Round(time.Millisecond))
}

// AwaitOutput is WaitOutput returning an error instead of failing the
// test, for callers that retry (a port taken by another test meanwhile).
func (p *Process) AwaitOutput(substr string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		// Exited first: once it is true, the output is complete.
		exited := p.Exited()
		p.mu.Lock()
		found := strings.Contains(p.out.String(), substr)
		changed := p.changed
		p.mu.Unlock()
		if found {
			return nil
		}
		if exited {
			code, err := p.Wait(0)
			return fmt.Errorf("%s exited (code %d, %v) without printing %q", p.name, code, err, substr)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("%s did not print %q within %v", p.name, substr, timeout)
		}
	}
}

func (p *Process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// lineWriter receives one of a child's output streams from exec's copying
// goroutine and hands complete lines to its Process.
type lineWriter struct {
	p       *Process
	partial []byte // only touched by exec's copier, then by flush after Wait
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.p.line(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	// Keep the remainder in a fresh slice so the buffer does not grow
	// without bound on a long-lived child.
	w.partial = append([]byte(nil), w.partial...)
	return len(b), nil
}

func (w *lineWriter) flush() {
	if len(w.partial) > 0 {
		w.p.line(w.partial)
		w.partial = nil
	}
}

// line records one line and logs it while the test runs.
func (p *Process) line(l []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out.Write(l)
	p.out.WriteByte('\n')
	if p.tb != nil {
		p.tb.Logf("[%s] %s", p.name, bytes.TrimRight(l, "\r"))
	}
	p.notifyLocked()
}

// FreePort returns a port on 127.0.0.1 that is free for both TCP and UDP at
// the time of the call (gossip binds both on one port). Another process may
// take it before it is used; callers that can should listen on port 0
// instead.
func FreePort(tb testing.TB) int {
	tb.Helper()
	var lastErr error
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lastErr = err
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		_ = ln.Close()
		if err != nil {
			lastErr = err
			continue
		}
		_ = pc.Close()
		return port
	}
	tb.Fatalf("find a free port on 127.0.0.1: %v", lastErr)
	return 0
}

// FreeAddr returns "127.0.0.1:port" for a port from FreePort.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}
