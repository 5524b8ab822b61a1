package shapes

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// shapeColumn is one column of the shapes table: a header and how to
// show a summary's figures in it.
type shapeColumn struct {
	head string
	cell func(*result.Result) string
}

// rateCell shows a msgs/s figure, starred when its drain did not finish.
func rateCell(name string) func(*result.Result) string {
	return func(r *result.Result) string {
		s := "—"
		if v, ok := r.Lookup(name); ok && !math.IsNaN(v) {
			s = measure.Thousands(int64(math.Round(v)))
		}
		completeName := strings.Replace(name, "msgs_per_sec", "complete", 1)
		if c, ok := r.Lookup(completeName); ok && c == 0 {
			s += "*"
		}
		return s
	}
}

// numCell shows a figure with the given format; "—" when absent.
func numCell(name, format string) func(*result.Result) string {
	return func(r *result.Result) string {
		v, ok := figureOr(r, name)
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			return "—"
		}
		return fmt.Sprintf(format, v)
	}
}

// pairCell shows two figures as "a / b".
func pairCell(a, b, format string) func(*result.Result) string {
	fa, fb := numCell(a, format), numCell(b, format)
	return func(r *result.Result) string { return fa(r) + " / " + fb(r) }
}

var shapeColumns = []shapeColumn{
	{"shape", func(r *result.Result) string { return ParamOf(r, "shape") }},
	{"rows", func(r *result.Result) string { return ParamOf(r, "msgs") }},
	{"classic msg/s (AN / no AN)", func(r *result.Result) string {
		return rateCell("classic_msgs_per_sec")(r) + " / " + rateCell("classic_msgs_per_sec_noanalyze")(r)
	}},
	{"Ordo msg/s (AN / no AN)", func(r *result.Result) string {
		if _, ok := r.Lookup("ordo_durable_msgs_per_sec"); ok {
			return rateCell("ordo_msgs_per_sec")(r) + " default / " + rateCell("ordo_durable_msgs_per_sec")(r) + " durable"
		}
		if _, ok := r.Lookup("ordo_msgs_per_sec"); !ok {
			if _, ok := r.Lookup("ordo_msgs_per_sec_noanalyze"); !ok {
				return rateCell("msgs_per_sec")(r) + " (broker)"
			}
		}
		return rateCell("ordo_msgs_per_sec")(r) + " / " + rateCell("ordo_msgs_per_sec_noanalyze")(r)
	}},
	{"Ordo ÷ classic (AN / no AN)", pairCell("ordo_over_classic", "ordo_over_classic_noanalyze", "%.2f×")},
	{"no AN ÷ AN (Ordo / classic)", pairCell("ordo_noanalyze_over_analyze", "classic_noanalyze_over_analyze", "%.2f×")},
	{"other ratio", func(r *result.Result) string {
		for _, f := range []struct{ name, what string }{
			{"parked_over_base", "÷ without parked"},
			{"ordo_over_stopwait", "÷ stop-and-wait"},
			{"durable_over_default", "durable ÷ default"},
		} {
			if v, ok := r.Lookup(f.name); ok {
				return fmt.Sprintf("%.2f× %s", v, f.what)
			}
		}
		return ""
	}},
	{"node RSS MiB", func(r *result.Result) string {
		a, ok1 := r.Lookup("ordo_node_rss_peak")
		b, ok2 := r.Lookup("ordo_node_rss_peak_noanalyze")
		if !ok1 && !ok2 {
			return "—"
		}
		return fmt.Sprintf("%.0f", max(a, b))
	}},
	{"PG insert µs (COPY / 1-row tx)", pairCell(firstOf("ordo_pg_insert_us"), "steady_pg_insert_us_per_msg", "%.0f")},
	{"PG read + mark µs (AN / no AN)", func(r *result.Result) string {
		f := func(s string) string {
			rd, ok1 := r.Lookup("ordo_pg_read_us" + s)
			mk, ok2 := r.Lookup("ordo_pg_mark_us" + s)
			if !ok1 || !ok2 {
				return "—"
			}
			return fmt.Sprintf("%.0f+%.0f", rd, mk)
		}
		return f("") + " / " + f("_noanalyze")
	}},
	{"PG sum µs", numCell(firstOf("ordo_pg_sum_us"), "%.0f")},
	{"node µs (AN / no AN)", pairCell("ordo_node_us", "ordo_node_us_noanalyze", "%.0f")},
	{"commit p50 / p99 ms", pairCell("steady_commit_p50", "steady_commit_p99", "%.1f")},
	{"Ordo lost/reord/gaps", func(r *result.Result) string {
		return fmt.Sprintf("%d/%d/%d", r.Check.Lost, r.Check.Reorders, r.Check.Gaps)
	}},
	{"classic reorders", func(r *result.Result) string {
		a, ok1 := r.Lookup("classic_reorders")
		b, ok2 := r.Lookup("classic_reorders_noanalyze")
		if !ok1 && !ok2 {
			return "—"
		}
		return fmt.Sprintf("%.0f", a+b)
	}},
}

// firstOf is a marker for a figure that exists with or without the
// _noanalyze suffix: the cell shows the one with ANALYZE when measured.
func firstOf(name string) string { return name + "|" }

// figureOr returns name, or name_noanalyze, for names marked with firstOf.
func figureOr(r *result.Result, name string) (float64, bool) {
	base, marked := strings.CutSuffix(name, "|")
	if !marked {
		return r.Lookup(name)
	}
	if v, ok := r.Lookup(base); ok {
		return v, true
	}
	return r.Lookup(base + "_noanalyze")
}

// ParamOf returns the named parameter of r as text; "" when absent.
func ParamOf(r *result.Result, name string) string {
	for _, p := range r.Params {
		if p.Name == name {
			return result.FormatValue(p.Value)
		}
	}
	return ""
}

// printShapeTable writes the summaries as a Markdown table, ready for
// docs/performance.md. A starred rate is of a drain that did not finish
// within -shape-limit.
func printShapeTable(w io.Writer, rows []*result.Result) {
	if len(rows) == 0 {
		return
	}
	var heads []string
	for _, c := range shapeColumns {
		heads = append(heads, c.head)
	}
	fmt.Fprintf(w, "\nshapes (AN = ANALYZE after loading; * = not drained within -shape-limit: the rate of what arrived)\n\n")
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	for _, r := range rows {
		var cells []string
		for _, c := range shapeColumns {
			cells = append(cells, c.cell(r))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}
