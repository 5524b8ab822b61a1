package childproc

import (
	"context"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const echoprocPkg = "github.com/ordo-relay/ordo/internal/childproc/testdata/echoproc"

// removeBinaries runs the tests, then deletes the binaries Build made,
// before goleak looks for leaked goroutines.
type removeBinaries struct{ m *testing.M }

func (r removeBinaries) Run() int {
	defer RemoveBinaries()
	return r.m.Run()
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(removeBinaries{m})
}

// TestStartOutsideATest drives Start as the bench and the demo use it: echo,
// bounded lines, LineAfter, Tail, and Stop both ways.
func TestStartOutsideATest(t *testing.T) {
	bin, _, err := Build(context.Background(), echoprocPkg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var echoed []string
	before := time.Now()
	p, err := Start("bounded", bin, []string{"x", "y"}, Options{
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

	stubborn, err := Start("stubborn", bin, []string{"ignoreterm"}, Options{})
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
		o    Options
		want string
	}{
		{"inherited", Options{}, "inherited"},
		{"environ replaces", Options{Environ: []string{"ECHOPROC_STDERR=from-environ"}}, "from-environ"},
		{"env added to environ", Options{Environ: []string{"ECHOPROC_STDERR=from-environ"}, Env: []string{"ECHOPROC_STDERR=from-env"}}, "from-env"},
		{"empty environ", Options{Environ: []string{}}, ""},
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
