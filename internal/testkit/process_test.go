package testkit

import (
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const echoprocPkg = "github.com/ordo-relay/ordo/internal/childproc/testdata/echoproc"

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
