package composecheck

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBinaries()
	os.Exit(code)
}

// binary is one program of the image the Dockerfile builds.
type binary struct {
	Path string // in the image
	Pkg  string // main package, as an import path
	Dir  string // main package, as the Dockerfile names it
}

// binaries are the programs compose may start, by their path in the image.
var binaries = []binary{
	{Path: "/usr/local/bin/ordo-node", Pkg: "github.com/ordo-relay/ordo/cmd/node", Dir: "./cmd/node"},
	{Path: "/usr/local/bin/orderapi", Pkg: "github.com/ordo-relay/ordo/cmd/orderapi", Dir: "./cmd/orderapi"},
	{Path: "/usr/local/bin/shipping", Pkg: "github.com/ordo-relay/ordo/cmd/shipping", Dir: "./cmd/shipping"},
}

// repoFile reads a file at the repository root.
func repoFile(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// ordoVar matches an Ordo environment variable name.
var ordoVar = regexp.MustCompile(`\bORDO_[A-Z0-9_]+\b`)

// TestComposeEnvironmentMatchesFlags checks that every ORDO_* variable
// docker-compose.yml sets is a flag of the binary the service runs, by
// looking for it in that binary's -h output, which lists each flag's
// variable.
func TestComposeEnvironmentMatchesFlags(t *testing.T) {
	compose := repoFile(t, "docker-compose.yml")
	dockerfile := repoFile(t, "Dockerfile")
	svcs, err := scanCompose(strings.NewReader(compose))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	defaultBin := dockerEntrypoint(t, dockerfile)

	// Which variables each binary must know, and where they are set.
	type use struct{ service, name string }
	need := map[string][]use{} // binary path -> uses
	scanned := 0
	for _, s := range svcs {
		var ordo []envVar
		for _, e := range s.Env {
			if strings.HasPrefix(e.Name, "ORDO_") {
				ordo = append(ordo, e)
			}
		}
		scanned += len(ordo)
		if len(ordo) == 0 {
			continue
		}
		if _, ok := s.Props["build"]; !ok {
			t.Errorf("service %s sets %s but does not build this repository's image", s.Name, ordo[0].Name)
			continue
		}
		if _, ok := s.Props["env_file"]; ok {
			t.Errorf("service %s uses env_file: its variables cannot be checked; set them under environment", s.Name)
		}
		bin := defaultBin
		if ep, ok := s.Props["entrypoint"]; ok {
			bin = ""
			for _, b := range binaries {
				if strings.Contains(ep, b.Path) {
					bin = b.Path
				}
			}
			if bin == "" {
				t.Errorf("service %s: entrypoint %q names none of %v", s.Name, ep, binaryPaths())
				continue
			}
		}
		for _, e := range ordo {
			need[bin] = append(need[bin], use{s.Name, e.Name})
		}
	}

	// The scanner must have seen every ORDO_ variable in the file: one it
	// missed (a form it does not read) would go unchecked.
	mentioned := 0
	sc := bufio.NewScanner(strings.NewReader(compose))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); !strings.HasPrefix(line, "#") {
			mentioned += len(ordoVar.FindAllString(line, -1))
		}
	}
	if mentioned != scanned {
		t.Errorf("docker-compose.yml mentions ORDO_ variables %d times outside comments, but %d are set under a service's environment: move them there so this test can check them", mentioned, scanned)
	}
	if len(need) == 0 {
		t.Fatal("docker-compose.yml sets no ORDO_ variable: the scanner is probably broken")
	}

	for _, b := range binaries {
		uses := need[b.Path]
		if len(uses) == 0 {
			continue
		}
		t.Run(filepath.Base(b.Path), func(t *testing.T) {
			t.Parallel()
			help := helpText(t, b.Pkg)
			for _, u := range uses {
				if !strings.Contains(help, "("+u.name+")") {
					t.Errorf("service %s sets %s, which is not a flag of %s (its -h lists %v)", u.service, u.name, b.Pkg, ordoVar.FindAllString(help, -1))
				}
			}
			t.Logf("%s: %d variables checked", b.Pkg, len(uses))
		})
	}
}

// TestDockerfileBuildsComposeBinaries checks that the Dockerfile builds
// every binary compose starts, from the right package, into the image.
func TestDockerfileBuildsComposeBinaries(t *testing.T) {
	compose := repoFile(t, "docker-compose.yml")
	dockerfile := repoFile(t, "Dockerfile")
	svcs, err := scanCompose(strings.NewReader(compose))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	used := map[string]bool{dockerEntrypoint(t, dockerfile): true}
	for _, s := range svcs {
		for _, b := range binaries {
			if strings.Contains(s.Props["entrypoint"], b.Path) {
				used[b.Path] = true
			}
		}
	}
	for _, b := range binaries {
		if !used[b.Path] {
			continue
		}
		name := filepath.Base(b.Path)
		build := regexp.MustCompile(`go build [^\n]*-o \S*/` + regexp.QuoteMeta(name) + `\s+` + regexp.QuoteMeta(b.Dir) + `\b`)
		if !build.MatchString(dockerfile) {
			t.Errorf("the Dockerfile does not build %s from %s (want a line matching %s)", name, b.Dir, build)
		}
		copyLine := regexp.MustCompile(`(?m)^COPY --from=\S+ [^\n]*/` + regexp.QuoteMeta(name) + `\b[^\n]* ` + regexp.QuoteMeta(filepath.Dir(b.Path)) + `/?$`)
		if !copyLine.MatchString(dockerfile) {
			t.Errorf("the Dockerfile does not copy %s into %s (want a line matching %s)", name, filepath.Dir(b.Path), copyLine)
		}
	}
}

func binaryPaths() []string {
	var p []string
	for _, b := range binaries {
		p = append(p, b.Path)
	}
	sort.Strings(p)
	return p
}

// dockerEntrypoint returns the program of the Dockerfile's last ENTRYPOINT
// (exec form), which runs for services that set no entrypoint.
func dockerEntrypoint(tb testing.TB, dockerfile string) string {
	tb.Helper()
	all := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"`).FindAllStringSubmatch(dockerfile, -1)
	if len(all) == 0 {
		tb.Fatal(`the Dockerfile has no ENTRYPOINT ["..."]`)
	}
	return all[len(all)-1][1]
}

// helpText builds pkg and returns what its -h prints.
func helpText(tb testing.TB, pkg string) string {
	tb.Helper()
	bin := testkit.BuildBinary(tb, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-h")
	// No ORDO_ variables from the test's environment: -h must not depend
	// on them.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ORDO_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 2) {
		tb.Fatalf("%s -h: %v\n%s", pkg, err, out)
	}
	if !ordoVar.Match(out) {
		tb.Fatalf("%s -h lists no ORDO_ variable; has its usage format changed?\n%s", pkg, out)
	}
	return string(out)
}

// TestComposeGossipIsKeyed checks that every service that gossips sets a
// gossip key: a node refuses -gossip-addr without -gossip-key unless told
// -gossip-insecure, and compose must not need that.
func TestComposeGossipIsKeyed(t *testing.T) {
	svcs, err := scanCompose(strings.NewReader(repoFile(t, "docker-compose.yml")))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	gossiping := 0
	for _, s := range svcs {
		set := map[string]bool{}
		for _, e := range s.Env {
			set[e.Name] = true
		}
		if !set["ORDO_GOSSIP_ADDR"] {
			continue
		}
		gossiping++
		if !set["ORDO_GOSSIP_KEY"] {
			t.Errorf("service %s sets ORDO_GOSSIP_ADDR without ORDO_GOSSIP_KEY: the node refuses to start", s.Name)
		}
		if set["ORDO_GOSSIP_INSECURE"] {
			t.Errorf("service %s sets ORDO_GOSSIP_INSECURE: compose gossips encrypted", s.Name)
		}
	}
	if gossiping == 0 {
		t.Fatal("no service sets ORDO_GOSSIP_ADDR: the scanner is probably broken")
	}
}
