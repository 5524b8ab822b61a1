package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// console writes the demo's narrative to out and its children's output,
// line by line with a prefix, to errw. It is safe for concurrent use: whole
// lines are written under one lock, so they never interleave mid-line.
type console struct {
	mu   sync.Mutex
	out  io.Writer
	errw io.Writer
}

func newConsole(out, errw io.Writer) *console {
	return &console{out: out, errw: errw}
}

// Printf writes to the narrative.
func (c *console) Printf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.out, format, args...)
}

// Step prints a section header.
func (c *console) Step(format string, args ...any) {
	c.Printf("\n== "+format+"\n", args...)
}

// childLine writes one line of a child's output.
func (c *console) childLine(prefix string, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.errw, "%s %s\n", prefix, bytes.TrimRight(line, "\r"))
}

// lineWriter hands complete lines to the console. exec calls Write from one
// goroutine at a time (Stdout and Stderr are the same writer); flush runs
// after Wait, when no Write is left.
type lineWriter struct {
	con     *console
	prefix  string
	partial []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.con.childLine(w.prefix, w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	w.partial = append([]byte(nil), w.partial...)
	return len(b), nil
}

func (w *lineWriter) flush() {
	if len(w.partial) > 0 {
		w.con.childLine(w.prefix, w.partial)
		w.partial = nil
	}
}

// child is a service the demo runs. It dies with the demo (Pdeathsig) and
// runs in its own process group, so a Ctrl-C in the terminal reaches only
// the demo, which then stops its children in order.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and its output is read
	err  error         // cmd.Wait's result; set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// childWaitDelay bounds reading a child's output after it has exited.
const childWaitDelay = 2 * time.Second

// startChild starts bin with env as its whole environment. Its output goes
// to con, each line prefixed with [name]. The returned child's goroutine
// waits for the process; Stop ends it.
func startChild(con *console, name, bin string, env []string) (*child, error) {
	w := &lineWriter{con: con, prefix: "[" + name + "]"}
	cmd := exec.Command(bin)
	cmd.Env = env
	cmd.Stdout = w
	cmd.Stderr = w
	cmd.WaitDelay = childWaitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		w.flush()
		c.err = err
		close(c.done)
	}()
	return c, nil
}

// exitError describes how the child ended; call it after done is closed.
func (c *child) exitError() error {
	if c.err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", c.name, c.err)
}

// Stop sends SIGTERM, waits up to grace for the child to exit, then kills
// it. It returns nil when the child exited with status 0 after SIGTERM.
// Stop is idempotent; later calls return the first result.
func (c *child) Stop(grace time.Duration) error {
	c.stopOnce.Do(func() {
		select {
		case <-c.done:
			c.stopErr = fmt.Errorf("%s had already exited: %w", c.name, errors.Join(c.exitError(), errors.New("see its output above")))
			return
		default:
		}
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			c.stopErr = fmt.Errorf("signal %s: %w", c.name, err)
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.done:
			c.stopErr = errors.Join(c.stopErr, c.exitError())
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.done
			c.stopErr = errors.Join(c.stopErr, fmt.Errorf("%s did not stop within %v of SIGTERM; killed", c.name, grace))
		}
	})
	return c.stopErr
}

// childEnv returns the demo's environment without any ORDO_ variable (the
// user's settings for other programs must not leak into the children),
// plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ORDO_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
