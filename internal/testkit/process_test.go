package testkit

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const echoprocPkg = "github.com/ordo-relay/ordo/internal/testkit/testdata/echoproc"

func TestProcessSignalAndExitCode(t *testing.T) {
	bin := BuildBinary(t, echoprocPkg)
	if again := BuildBinary(t, echoprocPkg); again != bin {
		t.Fatalf("second BuildBinary = %s, want the cached %s", again, bin)
	}
	p := StartProcess(t, "echo", bin, []string{"a", "b"}, []string{"ECHOPROC_STDERR=hello from stderr"})
	p.WaitOutput(t, "ready", 30*time.Second)
	if p.Exited() {
		t.Fatal("Exited = true before the signal")
	}
	if p.Pid() <= 0 {
		t.Fatalf("Pid = %d", p.Pid())
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	code, err := p.Wait(30 * time.Second)
	if err != nil || code != 3 {
		t.Fatalf("Wait = %d, %v; want 3, nil", code, err)
	}
	if !p.Exited() {
		t.Fatal("Exited = false after Wait")
	}
	out := p.Output()
	for _, want := range []string{"hello from stderr\n", "args: a,b\n", "ready\n", "got SIGTERM\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("Output lacks %q:\n%s", want, out)
		}
	}
	if err := p.Signal(syscall.SIGTERM); err != os.ErrProcessDone {
		t.Errorf("Signal after exit = %v, want os.ErrProcessDone", err)
	}
}

func TestProcessExitByItselfKeepsPartialLine(t *testing.T) {
	bin := BuildBinary(t, echoprocPkg)
	p := StartProcess(t, "exit7", bin, []string{"exit7"}, nil)
	code, err := p.Wait(30 * time.Second)
	if err != nil || code != 7 {
		t.Fatalf("Wait = %d, %v; want 7, nil", code, err)
	}
	if out := p.Output(); !strings.HasSuffix(out, "no newline at the end\n") {
		t.Errorf("Output does not end with the unterminated last line:\n%s", out)
	}
}

func TestProcessKillAndWaitTimeout(t *testing.T) {
	bin := BuildBinary(t, echoprocPkg)
	p := StartProcess(t, "killme", bin, nil, nil)
	p.WaitOutput(t, "ready", 30*time.Second)
	if code, err := p.Wait(10 * time.Millisecond); err == nil {
		t.Fatalf("Wait on a running process = %d, nil; want a timeout error", code)
	}
	p.Kill()
	code, err := p.Wait(30 * time.Second)
	if err == nil || code != -1 || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Wait after Kill = %d, %v; want -1 and a 'killed' error", code, err)
	}
	p.Kill() // idempotent
}

// TestProcessCleanupKills leaves a process running at the end of a subtest
// and checks that cleanup killed it.
func TestProcessCleanupKills(t *testing.T) {
	bin := BuildBinary(t, echoprocPkg)
	var p *Process
	t.Run("leave running", func(t *testing.T) {
		p = StartProcess(t, "left", bin, nil, nil)
		p.WaitOutput(t, "ready", 30*time.Second)
	})
	if !p.Exited() {
		t.Fatal("process still running after its test ended")
	}
	if _, err := p.Wait(0); err == nil {
		t.Fatal("Wait after cleanup: want a 'killed' error")
	}
}

func TestFreeAddr(t *testing.T) {
	addr := FreeAddr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("FreeAddr = %q", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on FreeAddr %s: %v", addr, err)
	}
	ln.Close()
}

// TestStartOutsideATest drives the TB-free Start the bench uses: echo,
// bounded lines, LineAfter, Tail, and Stop both ways.
func TestStartOutsideATest(t *testing.T) {
	bin, _, err := Build(context.Background(), echoprocPkg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var echoed []string
	before := time.Now()
	p, err := Start("bounded", bin, []string{"x", "y"}, ProcessOptions{
		OwnGroup:  true,
		KeepLines: 2,
		Echo: func(l string) {
			mu.Lock()
			echoed = append(echoed, l)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AwaitOutput("ready", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if pgid, err := syscall.Getpgid(p.Pid()); err != nil || pgid != p.Pid() {
		t.Errorf("Getpgid = %d, %v; want its own group %d", pgid, err, p.Pid())
	}
	code, err := p.Stop(30 * time.Second)
	if err != nil || code != 3 {
		t.Fatalf("Stop = %d, %v; want 3, nil", code, err)
	}
	mu.Lock()
	got := strings.Join(echoed, "|")
	mu.Unlock()
	if !strings.Contains(got, "ready") || !strings.Contains(got, "args: x,y") || !strings.Contains(got, "got SIGTERM") {
		t.Errorf("echoed %q: want every line", got)
	}
	if out := p.Output(); strings.Contains(out, "args") || !strings.HasSuffix(out, "ready\ngot SIGTERM\n") {
		t.Errorf("Output with KeepLines 2 = %q; want only the last two lines", out)
	}
	if tail := p.Tail(1); tail != "  got SIGTERM\n" {
		t.Errorf("Tail(1) = %q", tail)
	}
	if at, ok := p.LineAfter("ready", before); !ok || at.Before(before) {
		t.Errorf("LineAfter(ready) = %v, %v", at, ok)
	}
	if _, ok := p.LineAfter("ready", time.Now().Add(time.Hour)); ok {
		t.Error("LineAfter a future instant found a line")
	}

	stubborn, err := Start("stubborn", bin, []string{"ignoreterm"}, ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := stubborn.AwaitOutput("ready", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if code, err := stubborn.Stop(200 * time.Millisecond); err == nil || code != -1 || !stubborn.Exited() {
		t.Fatalf("Stop of a child ignoring SIGTERM = %d, %v (exited %v); want -1, a timeout error, exited", code, err, stubborn.Exited())
	}
}

// TestStartEnviron: with Environ the child starts from that environment,
// not this process's, and Env is added to it; without, it inherits.
func TestStartEnviron(t *testing.T) {
	bin, _, err := Build(context.Background(), echoprocPkg)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ECHOPROC_STDERR", "inherited")
	for _, tc := range []struct {
		name string
		o    ProcessOptions
		want string
	}{
		{"inherited", ProcessOptions{}, "inherited"},
		{"environ replaces", ProcessOptions{Environ: []string{"ECHOPROC_STDERR=from-environ"}}, "from-environ"},
		{"env added to environ", ProcessOptions{Environ: []string{"ECHOPROC_STDERR=from-environ"}, Env: []string{"ECHOPROC_STDERR=from-env"}}, "from-env"},
		{"empty environ", ProcessOptions{Environ: []string{}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Start(tc.name, bin, nil, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.AwaitOutput("ready", 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Stop(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			// stderr and stdout are read apart: look for the stderr line
			// among the others, in any order.
			var stderr []string
			for _, l := range strings.Split(strings.TrimSpace(p.Output()), "\n") {
				if !strings.HasPrefix(l, "args:") && l != "ready" && l != "got SIGTERM" {
					stderr = append(stderr, l)
				}
			}
			if got := strings.Join(stderr, "|"); got != tc.want {
				t.Errorf("ECHOPROC_STDERR printed %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPickAddr(t *testing.T) {
	addr, err := PickAddr()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on PickAddr %s: %v", addr, err)
	}
	ln.Close()
}

// TestPickPort: the ports handed out lie below the kernel's ephemeral
// range, where no outgoing connection or listener on port 0 can take them
// before they are used, and are free for TCP and UDP.
func TestPickPort(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		port, err := PickPort()
		if err != nil || port < pickLow || port >= low || reserved[port] {
			t.Fatalf("PickPort = %d, %v; want a port in %d..%d", port, err, pickLow, low-1)
		}
		if err := bindBoth(port); err != nil {
			t.Fatalf("port %d from PickPort: %v", port, err)
		}
	}
}

func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 400 {
		t.Fatalf("%d bytes written, want 400", n)
	}
}

func TestHostPort(t *testing.T) {
	if got := HostPort(t, "postgres://u:p@127.0.0.1:5432/db?sslmode=disable"); got != "127.0.0.1:5432" {
		t.Errorf("HostPort = %q", got)
	}
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); HostPort(f, "postgres:///db") }()
	<-done
	if !strings.Contains(f.msg, "no host:port") {
		t.Errorf("a URL without a port: %q, want a failure", f.msg)
	}
}
