package charts

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// Chart file names under -charts.
const (
	ChartScaleout = "scaleout.png"
	ChartShapes   = "shapes.png"
	ChartLatency  = "latency.png"
)

// Options are charts': where the PNGs go.
type Options struct {
	measure.Common
	Charts string // the directory the PNGs go to
}

func DefaultOptions() Options { return Options{Charts: "docs"} }

func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Charts, "charts", o.Charts, "directory for the PNGs")
}

func (o Options) Validate() error { return nil }

// Run draws the charts from the newest results under -out: the
// scale-out curve (scaleout), the shapes bars (shapes) and the latency
// distribution (latency and classic-latency). A chart whose results are
// missing is skipped with a message; it fails only when none could be
// drawn.
func Run(_ context.Context, o Options, _ func(*result.Result)) error {
	docs, err := readResults(o.Out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.Charts, 0o755); err != nil {
		return fmt.Errorf("charts directory: %w", err)
	}
	drawn := 0
	for _, c := range []struct {
		file string
		draw func([]result.JSON) (*plot.Plot, error)
	}{
		{ChartScaleout, scaleoutChart},
		{ChartShapes, shapesChart},
		{ChartLatency, latencyChart},
	} {
		p, err := c.draw(docs)
		if err != nil {
			fmt.Printf("chart %s skipped: %v\n", c.file, err)
			continue
		}
		path := filepath.Join(o.Charts, c.file)
		if err := p.Save(18*vg.Centimeter, 11*vg.Centimeter, path); err != nil {
			return fmt.Errorf("save %s: %w", path, err)
		}
		fmt.Printf("chart written to %s\n", path)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("no chart drawn: no scaleout, shapes or latency result under %s", o.Out)
	}
	return nil
}

// readResults reads every result file under dir, oldest first.
func readResults(dir string) ([]result.JSON, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	var docs []result.JSON
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("results: %w", err)
		}
		var d result.JSON
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("results: %s: %w", p, err)
		}
		docs = append(docs, d)
	}
	sort.SliceStable(docs, func(i, j int) bool { return docs[i].Started.Before(docs[j].Started) })
	return docs, nil
}

// newest returns, of docs of scenario, the newest for each key(doc), in
// the order the keys first appear.
func newest(docs []result.JSON, scenario string, key func(result.JSON) string) []result.JSON {
	idx := map[string]int{}
	var out []result.JSON
	for _, d := range docs { // oldest first: a later one replaces
		if d.Scenario != scenario {
			continue
		}
		k := key(d)
		if i, ok := idx[k]; ok {
			out[i] = d
			continue
		}
		idx[k] = len(out)
		out = append(out, d)
	}
	return out
}

var chartColors = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255},
	color.RGBA{R: 255, G: 127, B: 14, A: 255},
	color.RGBA{R: 44, G: 160, B: 44, A: 255},
	color.RGBA{R: 214, G: 39, B: 40, A: 255},
}

// scaleoutChart: speed-up (msgs/s ÷ the one-node msgs/s of the shape)
// against capped nodes, one line per shape, with the ideal line.
func scaleoutChart(docs []result.JSON) (*plot.Plot, error) {
	runs := newest(docs, "scaleout", func(d result.JSON) string { return d.ParamText("shape") + "/" + d.ParamText("nodes") })
	if len(runs) == 0 {
		return nil, errors.New("no scaleout result")
	}
	p := plot.New()
	p.Title.Text = "Scale-out: Ordo nodes, each capped at " + runs[0].ParamText("cap_cores") + " core (cgroup " + runs[0].ParamText("cgroup") + ")"
	p.X.Label.Text = "nodes"
	p.Y.Label.Text = "speed-up over one capped node"
	p.Add(plotter.NewGrid())
	most := 1.0
	byShape := map[string]plotter.XYs{}
	var shapes []string
	for _, d := range runs {
		s := d.ParamText("shape")
		if _, ok := byShape[s]; !ok {
			shapes = append(shapes, s)
		}
		n := d.Params["nodes"].(float64)
		byShape[s] = append(byShape[s], plotter.XY{X: n, Y: d.Figures["msgs_per_sec"]})
		most = max(most, n)
	}
	ideal, err := plotter.NewLine(plotter.XYs{{X: 1, Y: 1}, {X: most, Y: most}})
	if err != nil {
		return nil, err
	}
	ideal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	ideal.Color = color.Gray{Y: 120}
	p.Add(ideal)
	p.Legend.Add("ideal (N × one node)", ideal)
	for i, s := range shapes {
		xys := byShape[s]
		sort.Slice(xys, func(a, b int) bool { return xys[a].X < xys[b].X })
		one := 0.0
		for _, xy := range xys {
			if xy.X == 1 {
				one = xy.Y
			}
		}
		if one == 0 {
			continue
		}
		rel := make(plotter.XYs, len(xys))
		for j, xy := range xys {
			rel[j] = plotter.XY{X: xy.X, Y: xy.Y / one}
		}
		l, pts, err := plotter.NewLinePoints(rel)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = chartColors[i%len(chartColors)], chartColors[i%len(chartColors)]
		p.Add(l, pts)
		p.Legend.Add(fmt.Sprintf("%s keys (1 node: %.0f msg/s)", s, one), l, pts)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.X.Min, p.Y.Min = 0.8, 0
	p.Y.Max = most + 0.2
	return p, nil
}

// shapeBars are the bars of the shapes chart: a figure of each summary.
var shapeBars = []struct{ figure, legend string }{
	{"classic_msgs_per_sec", "classic, ANALYZE"},
	{"classic_msgs_per_sec_noanalyze", "classic, no ANALYZE"},
	{"ordo_msgs_per_sec", "Ordo, ANALYZE"},
	{"ordo_msgs_per_sec_noanalyze", "Ordo, no ANALYZE"},
}

// shapesChart: grouped bars, msgs/s per shape, classic and Ordo with and
// without ANALYZE, from the newest shapes run.
func shapesChart(docs []result.JSON) (*plot.Plot, error) {
	all := newest(docs, "shapes", func(d result.JSON) string { return d.ParamText("shape") })
	var rows []result.JSON
	for _, d := range all {
		if _, ok := d.Figures["ordo_over_classic"]; ok {
			rows = append(rows, d)
		} else if _, ok := d.Figures["ordo_over_classic_noanalyze"]; ok {
			rows = append(rows, d)
		}
	}
	if len(rows) == 0 {
		return nil, errors.New("no shapes result with both relays")
	}
	p := plot.New()
	p.Title.Text = "Backlog shapes: msgs/s, classic relay vs one Ordo node"
	p.Y.Label.Text = "msgs/s"
	p.Add(plotter.NewGrid())
	w := vg.Points(9)
	var names []string
	for _, d := range rows {
		names = append(names, d.ParamText("shape"))
	}
	for i, b := range shapeBars {
		vals := make(plotter.Values, len(rows))
		for j, d := range rows {
			vals[j] = d.Figures[b.figure] // 0 when not measured
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		bars.Color = chartColors[i%len(chartColors)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-1.5)
		p.Add(bars)
		p.Legend.Add(b.legend, bars)
	}
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(rows))-0.4 // room for the outer bars
	p.X.Tick.Label.Rotation = 0.35
	p.X.Tick.Label.XAlign = draw.XRight
	return p, nil
}

// latencyChart: the cumulative distribution of commit-to-delivery
// latency of the newest latency and classic-latency runs.
func latencyChart(docs []result.JSON) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Commit-to-delivery latency (CDF)"
	p.X.Label.Text = "latency, ms (log scale)"
	p.Y.Label.Text = "fraction of messages"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	drawn := 0
	for i, sc := range []string{"latency", "classic-latency"} {
		// The latency scenario's own runs, not the shapes' short steady ones.
		var d result.JSON
		for _, r := range newest(docs, sc, func(r result.JSON) string { return r.Label }) {
			if r.Label != "shape-steady" && len(r.Series["latency_ms"]) > 0 {
				d = r
			}
		}
		if len(d.Series["latency_ms"]) == 0 {
			continue
		}
		l, err := plotter.NewLine(cdf(d.Series["latency_ms"], 400))
		if err != nil {
			return nil, err
		}
		l.Color = chartColors[i%len(chartColors)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		name := "Ordo, 1 node"
		if sc == "classic-latency" {
			name = "classic relay"
		}
		p.Legend.Add(fmt.Sprintf("%s: p50 %.1f ms, p99 %.1f ms (%s commits/s)", name, d.Figures["latency_p50"], d.Figures["latency_p99"], d.ParamText("rate")), l)
		drawn++
	}
	if drawn == 0 {
		return nil, errors.New("no latency result with samples (run the latency scenario)")
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Y.Min, p.Y.Max = 0, 1
	p.X.Min = 0.1
	return p, nil
}

// cdf returns at most points points of the empirical CDF of ms, with
// values clipped to at least 0.1 ms (a log axis has no 0; a message
// delivered before its producer saw COMMIT return has a negative latency).
func cdf(ms []float64, points int) plotter.XYs {
	s := slices.Clone(ms)
	slices.Sort(s)
	step := max(1, len(s)/points)
	var out plotter.XYs
	for i := 0; i < len(s); i += step {
		out = append(out, plotter.XY{X: math.Max(s[i], 0.1), Y: float64(i+1) / float64(len(s))})
	}
	if n := len(s); n > 0 && out[len(out)-1].Y < 1 {
		out = append(out, plotter.XY{X: math.Max(s[n-1], 0.1), Y: 1})
	}
	return out
}
