package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/internal/childproc"
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
func (c *console) childLine(prefix, line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.errw, "%s %s\n", prefix, line)
}

// childKeepLines bounds the output lines kept per child: the demo only
// echoes them (to the console), it never reads them back.
const childKeepLines = 100

// child is a service the demo runs: a test-kit process that dies with the
// demo (Pdeathsig) and runs in its own process group, so a Ctrl-C in the
// terminal reaches only the demo, which then stops its children in order.
type child struct {
	name string
	proc *childproc.Process

	stopOnce sync.Once
	stopErr  error
}

// startChild starts bin with env as its whole environment. Its output goes
// to con, each line prefixed with [name]. Stop ends it.
func startChild(con *console, name, bin string, env []string) (*child, error) {
	prefix := "[" + name + "]"
	p, err := childproc.Start(name, bin, nil, childproc.Options{
		Environ:   env,
		OwnGroup:  true,
		KeepLines: childKeepLines,
		Echo:      func(line string) { con.childLine(prefix, line) },
	})
	if err != nil {
		return nil, err
	}
	return &child{name: name, proc: p}, nil
}

// done is closed once the child has exited and its output was read; nil
// (never ready) for no child.
func (c *child) done() <-chan struct{} {
	if c == nil {
		return nil
	}
	return c.proc.Done()
}

// exitError describes how the child ended: nil for exit status 0. Call it
// after done is closed.
func (c *child) exitError() error {
	code, err := c.proc.Wait(0)
	switch {
	case err != nil:
		return err
	case code != 0:
		return fmt.Errorf("%s: exit status %d", c.name, code)
	}
	return nil
}

// Stop sends SIGTERM, waits up to grace for the child to exit, then kills
// it. It returns nil when the child exited with status 0 after SIGTERM.
// Stop is idempotent; later calls return the first result. Stopping no
// child does nothing.
func (c *child) Stop(grace time.Duration) error {
	if c == nil {
		return nil
	}
	c.stopOnce.Do(func() {
		if c.proc.Exited() {
			c.stopErr = fmt.Errorf("%s had already exited: %w", c.name, errors.Join(c.exitError(), errors.New("see its output above")))
			return
		}
		code, err := c.proc.Stop(grace)
		switch {
		case err != nil:
			c.stopErr = err
		case code != 0:
			c.stopErr = fmt.Errorf("%s: exit status %d after SIGTERM", c.name, code)
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
