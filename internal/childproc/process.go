package childproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	took time.Duration
	err  error
}

// Build builds the main package pkg (an import path such as
// "github.com/ordo-relay/ordo/cmd/node", or a path relative to the
// current directory such as "./testdata/x") with go build, without -race,
// and returns the binary's path, how long this call spent building (zero
// when the binary was built before), or the compiler's output as an
// error. flags go to go build before pkg (the bench builds the node with
// "-tags", "ordobench"). Each pkg and flags is built once per process and
// shared by every caller; concurrent callers wait for the same build.
// Binaries live in one directory under os.TempDir for the whole process;
// RemoveBinaries deletes it.
func Build(ctx context.Context, pkg string, flags ...string) (bin string, took time.Duration, err error) {
	builds.mu.Lock()
	if builds.entries == nil {
		builds.entries = map[string]*buildEntry{}
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "ordo-testkit-bin-")
		if err != nil {
			builds.mu.Unlock()
			return "", 0, fmt.Errorf("build %s: %w", pkg, err)
		}
		builds.dir = dir
	}
	id := strings.Join(append(slices.Clone(flags), pkg), " ")
	e := builds.entries[id]
	if e == nil {
		e = &buildEntry{sub: filepath.Join(builds.dir, strconv.Itoa(len(builds.entries)))}
		builds.entries[id] = e
	}
	builds.mu.Unlock()

	first := false
	e.once.Do(func() {
		first = true
		e.bin, e.took, e.err = build(ctx, pkg, e.sub, flags)
	})
	if e.err != nil {
		return "", 0, e.err
	}
	if !first {
		return e.bin, 0, nil
	}
	return e.bin, e.took, nil
}

func build(ctx context.Context, pkg, dir string, flags []string) (string, time.Duration, error) {
	name := path.Base(filepath.ToSlash(pkg))
	if name == "." || name == "/" || name == "" {
		name = "main"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, fmt.Errorf("build %s: %w", pkg, err)
	}
	bin := filepath.Join(dir, name)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	args := append(append([]string{"build", "-o", bin}, flags...), pkg)
	out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return "", 0, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, time.Since(start), nil
}

// RemoveBinaries deletes the directory Build builds into. Call it when the
// binaries are no longer needed (a test binary from TestMain, after the
// tests have run); without it the directory is left in os.TempDir.
// Building again afterwards starts a new directory.
func RemoveBinaries() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
	builds.dir = ""
	builds.entries = nil
}

// Options are how a child is started and its output handled.
type Options struct {
	// Env is added to the child's environment ("K=V"; later ones win).
	Env []string
	// Environ, when not nil, is the environment the child starts from, in
	// place of this process's (which it otherwise inherits); Env is added
	// to it. The demo uses it to keep the user's ORDO_* settings away from
	// its children.
	Environ []string
	// OwnGroup starts the child in a process group of its own, so that a
	// Ctrl-C at the terminal reaches only the parent, which then stops the
	// child in order.
	OwnGroup bool
	// Echo, when set, receives each output line as it arrives.
	Echo func(line string)
	// KeepLines bounds the lines kept for Output, Tail and LineAfter: the
	// oldest are dropped beyond it. Zero keeps every line.
	KeepLines int
}

// Process is a child process started by Start. Its methods are safe for
// concurrent use.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	// waitErr is set before done is closed.
	waitErr error
	keep    int
	echo    func(string)

	mu      sync.Mutex
	lines   []outputLine
	changed chan struct{} // closed and replaced when output arrives or the process exits
}

type outputLine struct {
	at   time.Time
	text string
}

// Start starts bin with args, this process's environment (or o.Environ)
// plus o.Env ("K=V" entries, later ones win), and Pdeathsig set so that
// the child is killed if this process dies. Each line the child prints on
// stdout or stderr is kept for Output and AwaitOutput, and handed to
// o.Echo. The caller owns the child's end (Stop, or Kill and Wait).
//
// Pdeathsig follows the OS thread that started the child; the Go runtime
// does not end threads in normal operation, so in practice it follows
// this process.
func Start(name, bin string, args []string, o Options) (*Process, error) {
	p := &Process{
		name:    name,
		done:    make(chan struct{}),
		keep:    o.KeepLines,
		echo:    o.Echo,
		changed: make(chan struct{}),
	}
	cmd := exec.Command(bin, args...)
	base := o.Environ
	if base == nil {
		base = os.Environ()
	}
	// Never nil: a nil Env would make exec pass this process's environment.
	cmd.Env = append(append(make([]string, 0, len(base)+len(o.Env)), base...), o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: o.OwnGroup}
	cmd.Stdout = &lineWriter{p: p}
	cmd.Stderr = &lineWriter{p: p}
	cmd.WaitDelay = processWaitDelay
	p.cmd = cmd
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
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
	return p, nil
}

// Name returns the name the process was started with.
func (p *Process) Name() string { return p.name }

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

// Done is closed once the child has exited and its output was read.
func (p *Process) Done() <-chan struct{} { return p.done }

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

// Stop sends SIGTERM and waits up to timeout for the child to exit, then
// kills it and waits for that. It returns the exit code as Wait does, and
// an error naming the timeout when the child had to be killed.
func (p *Process) Stop(timeout time.Duration) (exitCode int, err error) {
	if err := p.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return -1, fmt.Errorf("stop %s: %w", p.name, err)
	}
	code, err := p.Wait(timeout)
	if p.Exited() {
		return code, err
	}
	p.Kill()
	<-p.done
	return -1, fmt.Errorf("%s did not stop within %v after SIGTERM; killed", p.name, timeout)
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

// Output returns everything the child has printed so far (the kept lines,
// see Options.KeepLines), stdout and stderr interleaved line by line.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.lines {
		b.WriteString(l.text)
		b.WriteByte('\n')
	}
	return b.String()
}

// Tail returns the last n lines of output, each indented by two spaces.
func (p *Process) Tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.lines[max(0, len(p.lines)-n):] {
		b.WriteString("  " + l.text + "\n")
	}
	return b.String()
}

// LineAfter returns when the first output line at or after t that holds
// substr arrived.
func (p *Process) LineAfter(substr string, t time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if !l.at.Before(t) && strings.Contains(l.text, substr) {
			return l.at, true
		}
	}
	return time.Time{}, false
}

// AwaitOutput waits until substr has appeared in the child's output. It
// returns an error when timeout passes first or the child exits without
// printing it.
func (p *Process) AwaitOutput(substr string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		// Exited first: once it is true, the output is complete.
		exited := p.Exited()
		p.mu.Lock()
		found := p.containsLocked(substr)
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

func (p *Process) containsLocked(substr string) bool {
	for _, l := range p.lines {
		if strings.Contains(l.text, substr) {
			return true
		}
	}
	return false
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

var _ io.Writer = (*lineWriter)(nil)

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

// line records one line and echoes it.
func (p *Process) line(l []byte) {
	text := string(bytes.TrimRight(l, "\r"))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keep > 0 && len(p.lines) == p.keep {
		copy(p.lines, p.lines[1:])
		p.lines = p.lines[:p.keep-1]
	}
	p.lines = append(p.lines, outputLine{time.Now(), text})
	if p.echo != nil {
		p.echo(text)
	}
	p.notifyLocked()
}
