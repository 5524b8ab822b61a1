package testkit

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/childproc"
)

// BuildBinary builds the main package pkg (an import path such as
// "github.com/ordo-relay/ordo/cmd/node", or a path relative to the test's
// directory such as "./testdata/x") with go build, without -race, and
// returns the binary's path: childproc.Build, failing tb with the
// compiler's output when the build fails. flags go to go build before pkg
// (cmd/shipping's tests build it with "-tags", "ordofaults"). Each pkg
// and flags is built once per test process and shared by every test;
// RemoveBinaries deletes the binaries.
func BuildBinary(tb testing.TB, pkg string, flags ...string) string {
	tb.Helper()
	bin, built, err := childproc.Build(context.Background(), pkg, flags...)
	if err != nil {
		tb.Fatal(err)
	}
	if built > 0 {
		tb.Logf("built %s in %v", pkg, built.Round(time.Millisecond))
	}
	return bin
}

// RemoveBinaries deletes the binaries BuildBinary built
// (childproc.RemoveBinaries). Call it from TestMain after the tests have
// run (for example from the Run method of a wrapper passed to
// goleak.VerifyTestMain); without it they are left in os.TempDir.
func RemoveBinaries() { childproc.RemoveBinaries() }

// Process is a child process started by StartProcess: a
// childproc.Process, with a wait that fails the test. Its methods are
// safe for concurrent use.
type Process struct {
	*childproc.Process
}

// StartProcess starts bin with args, the environment of the test process
// plus env ("K=V" entries, later ones win), dying with the test process
// (childproc.Start). Each line the child prints on stdout or stderr is
// logged through tb.Logf with a "[name] " prefix while the test runs, and
// kept for Output and WaitOutput. When tb ends, a child still running is
// killed with SIGKILL and waited for.
func StartProcess(tb testing.TB, name, bin string, args []string, env []string) *Process {
	tb.Helper()
	var mu sync.Mutex
	live := true // false once the test has ended: output is no longer logged
	p, err := childproc.Start(name, bin, args, childproc.Options{Env: env, Echo: func(line string) {
		mu.Lock()
		defer mu.Unlock()
		if live {
			tb.Logf("[%s] %s", name, line)
		}
	}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("started %s: pid %d: %s %s", name, p.Pid(), bin, strings.Join(args, " "))
	tb.Cleanup(func() {
		if !p.Exited() {
			p.Kill()
		}
		<-p.Done()
		mu.Lock()
		live = false
		mu.Unlock()
	})
	return &Process{p}
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
	tb.Logf("%s printed %q after %v", p.Name(), substr, time.Since(start).Round(time.Millisecond))
}
