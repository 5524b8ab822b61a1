// Package result is what every bench scenario and the nemesis report: a
// Result with parameters, figures and the checker's counts, printed for a
// person, as a RESULT line for a script, and as JSON for the record.
package result

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ordo-relay/ordo/internal/ordercheck"
)

// Result is what every scenario reports: its parameters, its measured
// figures, and the checker's counts. Print shows it to a person, Line to a
// script, WriteJSON keeps it.
type Result struct {
	Scenario string
	// Label tells apart results of one scenario run (e.g. "3-nodes"); it
	// becomes part of the JSON file name.
	Label string
	// Baseline marks a result of the classic design, which does not keep
	// per-key order: reorders and gaps are reported loudly but expected,
	// so they do not fail the run. Losses still do.
	Baseline bool
	Started  time.Time
	Finished time.Time
	Params   []Param  // in the order they were added
	Figures  []Figure // in the order they were added
	Check    Check
	Notes    []string // anything odd the scenario noticed, one sentence each
	// Series are raw samples kept for charts (latencies, say): written to
	// the JSON file only, never printed.
	Series map[string][]float64
}

// Param is one input of a run.
type Param struct {
	Name  string
	Value any // int, string or bool
}

// Figure is one measured number.
type Figure struct {
	Name  string
	Value float64
	Unit  string // "s", "ms", "msg/s", "MiB", ...; empty for counts
}

// Check is the order checker's verdict on every delivery of the run: the
// order checker's Report (ordercheck.History), written into the JSON as
// is.
type Check = ordercheck.Report

// Passed reports whether the run should count as a success: nothing lost,
// and for Ordo nothing reordered or skipped either.
func (r *Result) Passed() bool {
	if r.Baseline {
		return r.Check.Lost == 0
	}
	return r.Check.OK()
}

// New returns an empty result of scenario, started now.
func New(scenario string) *Result {
	return &Result{Scenario: scenario, Started: time.Now()}
}

// Lookup returns the named Lookup's value, and whether it was recorded.
func (r *Result) Lookup(name string) (float64, bool) {
	for _, f := range r.Figures {
		if f.Name == name {
			return f.Value, true
		}
	}
	return 0, false
}

// Param adds an input.
func (r *Result) Param(name string, value any) { r.Params = append(r.Params, Param{name, value}) }

// Figure adds a measured number, rounded to six significant digits.
func (r *Result) Figure(name string, value float64, unit string) {
	r.Figures = append(r.Figures, Figure{name, round6(value), unit})
}

// Seconds adds a duration as a figure in seconds.
func (r *Result) Seconds(name string, d time.Duration) { r.Figure(name, d.Seconds(), "s") }

// Millis adds a duration as a figure in milliseconds.
func (r *Result) Millis(name string, d time.Duration) {
	r.Figure(name, float64(d)/float64(time.Millisecond), "ms")
}

// AddSeries keeps raw samples under name for the JSON file.
func (r *Result) AddSeries(name string, values []float64) {
	if r.Series == nil {
		r.Series = map[string][]float64{}
	}
	r.Series[name] = values
}

// Note records an observation.
func (r *Result) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func round6(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	f, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 6, 64), 64)
	if err != nil {
		return v
	}
	return f
}

// FormatValue writes a parameter or figure value as Print and Line show it.
func FormatValue(v any) string {
	switch v := v.(type) {
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case time.Duration:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}

// Print writes the human table, the RESULT line and the checker's counts,
// with a loud line for anything lost, reordered or skipped.
func (r *Result) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	title := r.Scenario
	if r.Label != "" {
		title += " " + r.Label
	}
	fmt.Fprintf(tw, "\n%s\tparameter\t\n", title)
	for _, p := range r.Params {
		fmt.Fprintf(tw, "  %s\t%s\t\n", p.Name, FormatValue(p.Value))
	}
	fmt.Fprintf(tw, "\t\t\n%s\tfigure\tunit\n", title)
	for _, f := range r.Figures {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Name, FormatValue(f.Value), f.Unit)
	}
	_ = tw.Flush()
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w, r.Line())
	c := r.Check
	fmt.Fprintf(w, "check: total=%d distinct=%d duplicates=%d lost=%d reorders=%d gaps=%d keys=%d\n",
		c.Total, c.Distinct, c.Duplicates, c.Lost, c.Reorders, c.Gaps, c.Keys)
	if c.Lost > 0 {
		fmt.Fprintf(w, "!!! LOST %d (first ids: %s)\n", c.Lost, strings.Join(c.LostIDs, " "))
	}
	expected := ""
	if r.Baseline {
		expected = " (the classic baseline: it does not keep per-key order)"
	}
	if c.Reorders > 0 {
		fmt.Fprintf(w, "!!! REORDERED %d%s\n", c.Reorders, expected)
	}
	if c.Gaps > 0 {
		fmt.Fprintf(w, "!!! GAPS %d%s\n", c.Gaps, expected)
	}
	for _, p := range c.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
}

// Line returns the machine-readable line: "RESULT scenario=... k=v ...",
// parameters, then figures, then the checker's counts. Values never
// contain spaces.
func (r *Result) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "RESULT scenario=%s", r.Scenario)
	if r.Label != "" {
		fmt.Fprintf(&b, " label=%s", r.Label)
	}
	for _, p := range r.Params {
		fmt.Fprintf(&b, " %s=%s", p.Name, strings.ReplaceAll(FormatValue(p.Value), " ", "_"))
	}
	for _, f := range r.Figures {
		fmt.Fprintf(&b, " %s=%s", f.Name, FormatValue(f.Value))
	}
	c := r.Check
	fmt.Fprintf(&b, " total=%d distinct=%d duplicates=%d lost=%d reorders=%d gaps=%d",
		c.Total, c.Distinct, c.Duplicates, c.Lost, c.Reorders, c.Gaps)
	return b.String()
}

// JSON is the file format of WriteJSON.
type JSON struct {
	Scenario string               `json:"scenario"`
	Label    string               `json:"label,omitempty"`
	Baseline bool                 `json:"baseline,omitempty"`
	Started  time.Time            `json:"started"`
	Finished time.Time            `json:"finished"`
	Machine  machine              `json:"machine"`
	Params   map[string]any       `json:"params"`
	Figures  map[string]float64   `json:"figures"`
	Units    map[string]string    `json:"units"`
	Check    Check                `json:"check"`
	OK       bool                 `json:"ok"`
	Notes    []string             `json:"notes,omitempty"`
	Series   map[string][]float64 `json:"series,omitempty"`
}

type machine struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

// ParamText returns a parameter as text ("" when absent).
func (d JSON) ParamText(name string) string {
	v, ok := d.Params[name]
	if !ok {
		return ""
	}
	if f, ok := v.(float64); ok {
		return fmt.Sprint(f)
	}
	return fmt.Sprint(v)
}

// WriteJSON writes the result to dir/<scenario>-<start time>.json, creating
// dir, and returns the file's path.
func (r *Result) WriteJSON(dir string) (string, error) {
	doc := JSON{
		Scenario: r.Scenario, Label: r.Label, Baseline: r.Baseline, Started: r.Started, Finished: r.Finished,
		Machine: machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH},
		Params:  map[string]any{}, Figures: map[string]float64{}, Units: map[string]string{},
		Check: r.Check, OK: r.Passed(), Notes: r.Notes, Series: r.Series,
	}
	for _, p := range r.Params {
		doc.Params[p.Name] = p.Value
		if d, ok := p.Value.(time.Duration); ok {
			doc.Params[p.Name] = d.String()
		}
	}
	for _, f := range r.Figures {
		if math.IsNaN(f.Value) || math.IsInf(f.Value, 0) {
			continue // JSON has no NaN; an unmeasurable figure is left out
		}
		doc.Figures[f.Name] = f.Value
		if f.Unit != "" {
			doc.Units[f.Name] = f.Unit
		}
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encode result: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("results directory: %w", err)
	}
	name := r.Scenario
	if r.Label != "" {
		name += "-" + r.Label
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.json", name, r.Started.Format("20060102-150405")))
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("write result: %w", err)
	}
	return path, nil
}

// Percentile returns the q-quantile (0 <= q <= 1) of sorted by the
// nearest-rank method; 0 for an empty slice.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted)) + 0.999999999)
	return sorted[min(max(rank, 1), len(sorted))-1]
}
