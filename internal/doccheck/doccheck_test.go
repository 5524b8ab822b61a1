package doccheck

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's top directory, seen from this package.
const root = "../.."

// docs lists the Markdown files the tests read, relative to root.
func docs(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "CHANGELOG.md"}
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

// referenceDocs are the docs that describe the system as it is: every doc
// but the changelog, whose job is the history.
func referenceDocs(t *testing.T) []string {
	var out []string
	for _, d := range docs(t) {
		if d != "CHANGELOG.md" {
			out = append(out, d)
		}
	}
	return out
}

// line is one line of a file, with where it is.
type line struct {
	file string
	num  int
	text string
}

// lines reads file (relative to root); a missing file has no lines.
func lines(t *testing.T, file string) []line {
	t.Helper()
	f, err := os.Open(filepath.Join(root, file))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		out = append(out, line{file: file, num: n, text: sc.Text()})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return out
}

// goFiles lists every .go file of both modules, relative to root.
func goFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	// mdLink is a Markdown link's target.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// codeSpan is an inline code span.
	codeSpan = regexp.MustCompile("`([^`]+)`")
	// pathLike is a relative path with at least one slash, e.g.
	// relay/flight.go, cmd/node, deploy/prometheus/alerts.yml.
	pathLike = regexp.MustCompile("(^|[\\s(,;\"'`])(?:\\./)?([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.*-]+)+/?)")
	// goFileName is a bare Go file name, e.g. flight.go.
	goFileName = regexp.MustCompile(`^[a-z0-9_]+\.go$`)
)

// topDirs are the repository's top-level entries: a path-like word counts
// as a repository path when its first element is one of them.
func topDirs(t *testing.T) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") || e.Name() == ".ci" {
			out[e.Name()] = true
		}
	}
	return out
}

// goSymbol is a package path's last element followed by an exported name,
// as in internal/backoff.Doubled.
var goSymbol = regexp.MustCompile(`^(.*)\.[A-Z][A-Za-z0-9_]*$`)

// exists reports whether the path (relative to root; it may hold a glob)
// names something in the repository: a file or directory, a package's
// exported name (internal/backoff.Doubled), or something .gitignore keeps
// out of the repository because the tools write it (bench/results/).
func exists(p string) bool {
	m, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(p)))
	if err == nil && len(m) > 0 {
		return true
	}
	if s := goSymbol.FindStringSubmatch(p); s != nil {
		return exists(s[1])
	}
	ignore, err := os.ReadFile(filepath.Join(root, ".gitignore"))
	if err != nil {
		return false
	}
	for _, g := range strings.Split(string(ignore), "\n") {
		g = strings.Trim(strings.TrimSpace(g), "/")
		if g != "" && !strings.ContainsAny(g, "*?[") && strings.Trim(p, "/") == g {
			return true
		}
	}
	return false
}

// anchors are the link anchors of a Markdown file's headings, as GitHub
// makes them: lower case, spaces to hyphens, punctuation dropped, and -1,
// -2, ... after repeats.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	inCode := false
	for _, l := range lines(t, file) {
		if strings.HasPrefix(strings.TrimSpace(l.text), "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l.text, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(l.text, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if !out[a] {
			out[a] = true
			continue
		}
		for i := 1; ; i++ {
			if n := fmt.Sprintf("%s-%d", a, i); !out[n] {
				out[n] = true
				break
			}
		}
	}
	return out
}

// TestDocsNameOnlyExistingPaths: every repository path a doc names, as a
// Markdown link or a path in its text (CHANGELOG.md: its links only) (relay/flight.go, cmd/node/,
// deploy/prometheus/alerts.yml), exists, and every Go file named alone in
// code (`flight.go`) is some file's name, and a link's #anchor is a
// heading of the file it links to. A doc that names a file or a section a
// change removed sends its reader nowhere.
func TestDocsNameOnlyExistingPaths(t *testing.T) {
	top := topDirs(t)
	base := map[string]bool{}
	for _, f := range goFiles(t) {
		base[filepath.Base(f)] = true
	}
	for _, doc := range docs(t) {
		dir := filepath.ToSlash(filepath.Dir(doc))
		for _, l := range lines(t, doc) {
			for _, m := range mdLink.FindAllStringSubmatch(l.text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, frag, _ := strings.Cut(target, "#")
				file := filepath.ToSlash(filepath.Join(dir, target))
				if target == "" {
					file = l.file
				}
				if !exists(file) {
					t.Errorf("%s:%d: link to %s, which does not exist", l.file, l.num, m[1])
					continue
				}
				if frag != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[frag] {
					t.Errorf("%s:%d: link to %s: %s has no heading with the anchor #%s", l.file, l.num, m[1], file, frag)
				}
			}
			if doc == "CHANGELOG.md" {
				// The history names files as they were; only its links
				// must lead somewhere.
				continue
			}
			for _, m := range pathLike.FindAllStringSubmatch(l.text, -1) {
				p := strings.TrimRight(m[2], ".,:;")
				first, _, _ := strings.Cut(p, "/")
				if !top[first] || strings.Contains(l.text, "://"+p) {
					continue
				}
				if !exists(p) {
					t.Errorf("%s:%d: names %s, which does not exist", l.file, l.num, p)
				}
			}
			for _, m := range codeSpan.FindAllStringSubmatch(l.text, -1) {
				if goFileName.MatchString(m[1]) && !base[m[1]] {
					t.Errorf("%s:%d: names %s, and no Go file has that name", l.file, l.num, m[1])
				}
			}
		}
	}
}

var (
	issueRef = regexp.MustCompile(`\b[Ii]ssues? #?[0-9]+`)
	// commitLike is a short commit hash: 7 to 12 hex digits with at least
	// one letter and one digit, standing alone (not part of a UUID or a
	// longer hex value).
	commitLike = regexp.MustCompile(`(^|[^0-9A-Za-z_-])([0-9a-f]{7,12})($|[^0-9A-Za-z_-])`)
	hasLetter  = regexp.MustCompile(`[a-f]`)
	hasDigit   = regexp.MustCompile(`[0-9]`)
	outsideDoc = regexp.MustCompile(`DESIGN\.md|\.\./shared/`)
)

// TestReferenceDocsStateToday: the reference docs (every doc but
// CHANGELOG.md) and the Go files cite no issue number, no commit hash and
// no design notes kept outside the repository; the history goes in
// CHANGELOG.md, and a reader of the reference needs none of it.
func TestReferenceDocsStateToday(t *testing.T) {
	var all []line
	for _, d := range referenceDocs(t) {
		all = append(all, lines(t, d)...)
	}
	for _, f := range goFiles(t) {
		if strings.HasPrefix(f, filepath.FromSlash("internal/doccheck/")) {
			continue
		}
		all = append(all, lines(t, f)...)
	}
	for _, l := range all {
		if m := issueRef.FindString(l.text); m != "" {
			t.Errorf("%s:%d: cites %q; state the fact without the history", l.file, l.num, m)
		}
		if m := outsideDoc.FindString(l.text); m != "" {
			t.Errorf("%s:%d: cites %s, which is not in the repository; cite docs/", l.file, l.num, m)
		}
		if strings.HasSuffix(l.file, ".go") {
			continue
		}
		for _, m := range commitLike.FindAllStringSubmatch(l.text, -1) {
			if h := m[2]; hasLetter.MatchString(h) && hasDigit.MatchString(h) {
				t.Errorf("%s:%d: names %s, which looks like a commit hash; say what the code does instead", l.file, l.num, h)
			}
		}
	}
}

// longestParagraph is the most lines a paragraph of docs/design.md may
// have: a reader should never face a wall of text.
const longestParagraph = 25

// TestDesignParagraphsAreShort: docs/design.md has no paragraph (a run of
// non-blank lines outside code blocks and tables) over longestParagraph
// lines.
func TestDesignParagraphsAreShort(t *testing.T) {
	var run []line
	inCode := false
	flush := func() {
		if len(run) > longestParagraph {
			t.Errorf("%s:%d: a paragraph of %d lines (at most %d); split it", run[0].file, run[0].num, len(run), longestParagraph)
		}
		run = run[:0]
	}
	for _, l := range lines(t, "docs/design.md") {
		trimmed := strings.TrimSpace(l.text)
		if strings.HasPrefix(trimmed, "```") {
			inCode = !inCode
			flush()
			continue
		}
		if inCode || trimmed == "" || strings.HasPrefix(trimmed, "|") || strings.HasPrefix(trimmed, "#") {
			flush()
			continue
		}
		run = append(run, l)
	}
	flush()
}
