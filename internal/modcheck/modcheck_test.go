package modcheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// toolOnly are module path prefixes that only the tools module may require.
var toolOnly = []string{"gonum.org/", "github.com/chromedp/"}

// scratchModule writes a module outside the repository's workspace whose
// main package imports pkgs (the repository replaced in), as a user's
// program would, and returns its directory.
func scratchModule(t *testing.T, pkgs ...string) string {
	t.Helper()
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
	var imports strings.Builder
	for _, p := range pkgs {
		fmt.Fprintf(&imports, "\t_ %q\n", "github.com/ordo-relay/ordo/"+p)
	}
	write("main.go", "package main\n\nimport (\n"+imports.String()+")\n\nfunc main() {}\n")
	write("go.mod", "module example.com/libraryuser\n\ngo 1.26.8\n\n"+
		"require github.com/ordo-relay/ordo v0.0.0\n\n"+
		"replace github.com/ordo-relay/ordo => "+root+"\n")
	// The library's go.sum holds every checksum the user's graph needs.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	return dir
}

// goList runs go list args in dir outside the workspace, as a user's
// module is; -mod=mod lets go list complete the scratch go.mod's indirect
// requirements. It returns the output's lines.
func goList(t *testing.T, dir string, args ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestLibraryUserGetsNoToolDependencies builds a scratch module that
// imports only outbox and inbox, and checks that go list -m all, the
// user's whole module graph, has none of the tools' dependencies but does
// have the library's own.
func TestLibraryUserGetsNoToolDependencies(t *testing.T) {
	lines := goList(t, scratchModule(t, "inbox", "outbox"), "-m", "all")
	mods := strings.Fields(strings.Join(lines, "\n"))
	for _, want := range []string{"github.com/ordo-relay/ordo", "github.com/jackc/pgx/v5", "github.com/rabbitmq/amqp091-go"} {
		if !contains(mods, want) {
			t.Errorf("the user's module graph lacks %s, so this check looks at the wrong graph:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	for _, line := range lines {
		for _, p := range toolOnly {
			if strings.HasPrefix(line, p) {
				t.Errorf("a module importing only outbox and inbox gets %s: move its user into the tools module (bench/go.mod)", line)
			}
		}
	}
}

// commandOnly are package path prefixes a library must not link: the
// OpenTelemetry SDK, its exporters and the gRPC they bring, which the
// commands install (internal/otelsetup), and the test rigs. (protobuf is
// not among them: the Prometheus client the libraries use links it.)
var commandOnly = []string{
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/exporters/",
	"google.golang.org/grpc",
	"testing",
	"github.com/ordo-relay/ordo/internal/testkit",
	"github.com/ordo-relay/ordo/internal/nodetest",
}

// TestLibraryLinksOnlyTheOtelAPI builds a scratch module that imports
// outbox, inbox and relay, and checks that the packages it links (go list
// -deps) include the OpenTelemetry API but not the SDK, an exporter, gRPC
// or a test rig: a library depends on the API alone, and the
// application installs the SDK.
func TestLibraryLinksOnlyTheOtelAPI(t *testing.T) {
	deps := goList(t, scratchModule(t, "inbox", "outbox", "relay"), "-deps", ".")
	for _, want := range []string{"go.opentelemetry.io/otel/trace", "github.com/ordo-relay/ordo/relay"} {
		if !contains(deps, want) {
			t.Errorf("the user's program does not link %s, so this check looks at the wrong graph", want)
		}
	}
	found := map[string][]string{}
	for _, d := range deps {
		if p, ok := hasPrefix(d, commandOnly); ok {
			found[p] = append(found[p], d)
		}
	}
	for _, p := range commandOnly {
		if pkgs := found[p]; len(pkgs) > 0 {
			t.Errorf("a program importing outbox, inbox and relay links %d packages under %s (%s): keep them out of the libraries", len(pkgs), p, strings.Join(pkgs[:min(3, len(pkgs))], ", "))
		}
	}
}

// hasPrefix reports which of prefixes pkg is or lies under.
func hasPrefix(pkg string, prefixes []string) (string, bool) {
	for _, p := range prefixes {
		if pkg == strings.TrimSuffix(p, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(p, "/")+"/") {
			return p, true
		}
	}
	return "", false
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

// TestExampleCommandsLinkNoTestRig checks that no command links the
// testing package or a test rig: the example consumer a user copies
// (cmd/shipping), the demo (cmd/demo, which starts its children with
// internal/childproc and checks the order of what arrives with
// internal/ordercheck), the node and the order API. Fault injection
// (internal/inboxfaults, which cmd/shipping links only when built with the
// ordofaults tag) and test kits belong to the tests, the bench and the
// nemesis. Every directory under cmd/ is checked, as built by default, so
// a new command is too.
func TestExampleCommandsLinkNoTestRig(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, e := range entries {
		if e.IsDir() {
			cmds = append(cmds, "./cmd/"+e.Name())
		}
	}
	if !slices.Contains(cmds, "./cmd/demo") || !slices.Contains(cmds, "./cmd/shipping") {
		t.Fatalf("commands %v: want cmd/demo and cmd/shipping among them", cmds)
	}
	for _, cmd := range cmds {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		c := exec.CommandContext(ctx, "go", "list", "-deps", cmd)
		c.Dir = root
		out, err := c.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", cmd, err, out)
		}
		for _, d := range strings.Fields(string(out)) {
			if d == "testing" || strings.HasPrefix(d, "github.com/ordo-relay/ordo/internal/testkit") ||
				strings.HasPrefix(d, "github.com/ordo-relay/ordo/internal/nodetest") ||
				strings.HasPrefix(d, "github.com/ordo-relay/ordo/internal/inboxfaults") {
				t.Errorf("%s links %s: keep test rigs out of the example commands", cmd, d)
			}
		}
	}
}
