package modcheck

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// toolOnly are module path prefixes that only the tools module may require.
var toolOnly = []string{"gonum.org/", "github.com/chromedp/"}

// TestLibraryUserGetsNoToolDependencies builds a scratch module that
// imports only outbox and inbox (the repository replaced in), and checks
// that go list -m all, the user's whole module graph, has none of the
// tools' dependencies but does have the library's own.
func TestLibraryUserGetsNoToolDependencies(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", `package main

import (
	_ "github.com/ordo-relay/ordo/inbox"
	_ "github.com/ordo-relay/ordo/outbox"
)

func main() {}
`)
	write("go.mod", "module example.com/libraryuser\n\ngo 1.26.8\n\n"+
		"require github.com/ordo-relay/ordo v0.0.0\n\n"+
		"replace github.com/ordo-relay/ordo => "+root+"\n")
	// The library's go.sum holds every checksum the user's graph needs.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "all")
	cmd.Dir = dir
	// Outside the repository's workspace, as a user's module is; -mod=mod
	// lets go list complete the scratch go.mod's indirect requirements.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	mods := strings.Fields(string(out))
	for _, want := range []string{"github.com/ordo-relay/ordo", "github.com/jackc/pgx/v5", "github.com/rabbitmq/amqp091-go"} {
		if !contains(mods, want) {
			t.Errorf("the user's module graph lacks %s, so this check looks at the wrong graph:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		for _, p := range toolOnly {
			if strings.HasPrefix(line, p) {
				t.Errorf("a module importing only outbox and inbox gets %s: move its user into the tools module (bench/go.mod)", line)
			}
		}
	}
}

func contains(fields []string, s string) bool {
	for _, f := range fields {
		if f == s {
			return true
		}
	}
	return false
}

// TestToolsModuleLoadsAlone loads every package of the tools module
// (bench/go.mod), tests included, outside the workspace, as the
// Dockerfile's GOWORK=off build and a plain `go -C bench build` do. In the
// workspace go.work.sum and the library's go.sum hide a bench/go.sum that
// lacks a checksum (the library's OpenTelemetry went missing from it once);
// outside it the go command stops with "missing go.sum entry". The fix is
// `GOWORK=off go -C bench mod tidy`.
func TestToolsModuleLoadsAlone(t *testing.T) {
	bench, err := filepath.Abs(filepath.Join("..", "..", "bench"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-test", "./...")
	cmd.Dir = bench
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GOWORK=off go list -deps -test ./... in bench: %v (run GOWORK=off go -C bench mod tidy)\n%s", err, lastLines(out, 20))
	}
}

// lastLines returns at most n trailing lines of out.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
