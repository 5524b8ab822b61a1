package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// benchCommand finds a go run ./bench command (not ./bench/cmd/...) up to
// the end of its line, a backtick, a pipe or a shell separator.
var benchCommand = regexp.MustCompile("go run \\./bench((?:\\s+[^\\s`|;&#]+)*)")

// documentedBenchCommands returns every go run ./bench command line in the
// repository's docs, README and scripts, with the file and line it is on.
// Lines with a placeholder (..., …, [flags], <scenario>, N) are left out.
func documentedBenchCommands(t *testing.T) map[string][]string {
	t.Helper()
	var files []string
	for _, pat := range []string{"../docs/*.md", "../README.md", "../scripts/*", "*.md"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	cmds := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		for i, line := range lines {
			for _, m := range benchCommand.FindAllStringSubmatchIndex(inlineSpan(lines, i), -1) {
				if m[0] >= len(line) {
					continue // on a later line: found there
				}
				args := strings.Fields(inlineSpan(lines, i)[m[2]:m[3]])
				if len(args) > 0 && strings.HasPrefix(args[0], "/cmd/") || placeholder(args) {
					continue
				}
				cmds[f+":"+strconv.Itoa(i+1)] = args
			}
		}
	}
	return cmds
}

// inlineSpan returns lines[i], continued with the lines after it while an
// inline code span (a backtick) opened on it is not closed: markdown
// wraps a long command in a paragraph over several lines.
func inlineSpan(lines []string, i int) string {
	text := lines[i]
	for j := i + 1; j < len(lines) && j <= i+3 && strings.Count(text, "`")%2 == 1; j++ {
		text += " " + lines[j]
	}
	return text
}

func placeholder(args []string) bool {
	for _, a := range args {
		if strings.Contains(a, "...") || strings.Contains(a, "…") || strings.ContainsAny(a, "[<") || a == "N" || a == "M" {
			return true
		}
	}
	return false
}

// TestDocumentedBenchCommandsParse parses every go run ./bench command the
// docs show, so that the docs and the flags cannot drift apart: a flag
// renamed, removed or moved to another scenario fails here with the file
// and line.
func TestDocumentedBenchCommandsParse(t *testing.T) {
	cmds := documentedBenchCommands(t)
	if len(cmds) < 20 {
		t.Fatalf("found only %d documented bench commands: the scan is broken", len(cmds))
	}
	t.Logf("%d documented commands", len(cmds))
	none := func(string) (string, bool) { return "", false }
	for where, args := range cmds {
		if _, err := parseArgs(args, none, io.Discard); err != nil && !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: go run ./bench %s: %v", where, strings.Join(args, " "), err)
		}
	}
}

// scenarioFlagsRow is a row of docs/bench.md's "which scenario takes which
// flag" table: | `drain` | `-rows` `-keys` ... |.
var scenarioFlagsRow = regexp.MustCompile("^\\| `([a-z-]+)` \\| ((?:`-[a-z*-]+` ?)+)\\|$")

// TestDocumentedScenarioFlags checks docs/bench.md's table of which
// scenario takes which flag against each scenario's flag set: every
// scenario has a row, every flag of it is named (-produce-* names every
// flag so prefixed) and the row names no other.
func TestDocumentedScenarioFlags(t *testing.T) {
	b, err := os.ReadFile("../docs/bench.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		m := scenarioFlagsRow.FindStringSubmatch(line)
		if m == nil || findScenario(m[1]) == nil {
			continue
		}
		if rows[m[1]] != nil {
			t.Errorf("docs/bench.md: scenario %s has two rows", m[1])
		}
		rows[m[1]] = strings.Fields(strings.ReplaceAll(m[2], "`", ""))
	}
	for _, s := range allScenarios() {
		doc, ok := rows[s.name]
		if !ok {
			t.Errorf("docs/bench.md: no row for scenario %s", s.name)
			continue
		}
		used := map[string]bool{}
		scenarioFlagSet(s, s.options()).VisitAll(func(f *flag.Flag) {
			for _, d := range doc {
				if d == "-"+f.Name || strings.HasSuffix(d, "*") && strings.HasPrefix("-"+f.Name, strings.TrimSuffix(d, "*")) {
					used[d] = true
					return
				}
			}
			t.Errorf("docs/bench.md: the row of %s lacks -%s", s.name, f.Name)
		})
		for _, d := range doc {
			if !used[d] {
				t.Errorf("docs/bench.md: the row of %s names %s, which it does not take", s.name, d)
			}
		}
	}
}
