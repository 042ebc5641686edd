package main

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// series is one line of a chart, or one colour of bars.
type series struct {
	name   string
	xs, ys []float64
	color  string
	dash   bool
}

const (
	svgW, svgH             = 820, 480
	padL, padR, padT, padB = 70, 200, 40, 50
	plotW, plotH           = svgW - padL - padR, svgH - padT - padB
	fontAttrs              = `font-family="sans-serif" font-size="12"`
)

// niceTicks returns round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var t []float64
	top := math.Ceil(hi/step-1e-9) * step
	for v := math.Floor(lo/step) * step; v <= top+step/1e6; v += step {
		t = append(t, v)
	}
	return t
}

func fmtTick(v float64) string {
	switch {
	case v >= 1000 && math.Mod(v, 1000) == 0:
		return fmt.Sprintf("%gk", v/1000)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// axis maps values onto a length of pixels, linearly or on a log10 scale.
type axis struct {
	lo, hi float64
	log    bool
	ticks  []float64
}

// newAxis covers [lo, hi] with round ticks: 1, 2, 5 per decade on a log
// scale (where lo must be positive), about n from 0 on a linear one.
func newAxis(lo, hi float64, log bool, n int) axis {
	if !log {
		t := niceTicks(0, hi, n)
		return axis{lo: 0, hi: t[len(t)-1], ticks: t}
	}
	// Whole exponents: a fractional one makes ticks like 0.10000000000000005.
	elo, ehi := int(math.Floor(math.Log10(lo))), int(math.Ceil(math.Log10(hi)))
	if ehi == elo {
		ehi++
	}
	a := axis{log: true, lo: math.Pow10(elo), hi: math.Pow10(ehi)}
	for e := elo; e <= ehi; e++ {
		for _, m := range []float64{1, 2, 5} {
			if v := m * math.Pow10(e); v <= a.hi*(1+1e-9) {
				a.ticks = append(a.ticks, v)
			}
		}
	}
	return a
}

// at is v's share of the axis, 0 to 1.
func (a axis) at(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// span is the smallest and largest value of the series (positive ones only
// on a log scale), 0 to 1 when there is none.
func span(ss []series, ys bool, log bool) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		vs := s.xs
		if ys {
			vs = s.ys
		}
		for _, v := range vs {
			if math.IsNaN(v) || log && v <= 0 {
				continue
			}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return 1, 1
	}
	return lo, hi
}

func px(x axis, v float64) float64 { return padL + plotW*x.at(v) }
func py(y axis, v float64) float64 { return padT + plotH*(1-y.at(v)) }

// frame starts an SVG chart: title, grid, the y axis's ticks, the x axis's
// ticks (or the labels xlabels at xs, for categories) and the axes' names.
func frame(b *strings.Builder, title, xlabel, ylabel string, x, y axis, xs []float64, xlabels []string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="22" font-family="sans-serif" font-size="15" font-weight="bold">%s</text>`+"\n", padL, esc(title))
	if xlabels == nil {
		xs = x.ticks
		for _, v := range xs {
			xlabels = append(xlabels, fmtTick(v))
			x := px(x, v)
			fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, padT, x, padT+plotH)
		}
	}
	for i, v := range xs {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" %s text-anchor="middle">%s</text>`+"\n", px(x, v), padT+plotH+18, fontAttrs, esc(xlabels[i]))
	}
	for _, v := range y.ticks {
		y := py(y, v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", padL, y, padL+plotW, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" %s text-anchor="end">%s</text>`+"\n", padL-6, y+4, fontAttrs, fmtTick(v))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", padL, padT, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" %s text-anchor="middle">%s</text>`+"\n", padL+plotW/2, svgH-10, fontAttrs, esc(xlabel))
	fmt.Fprintf(b, `<text x="16" y="%d" %s text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n", padT+plotH/2, fontAttrs, padT+plotH/2, esc(ylabel))
}

// legend writes series i's entry at the right of the plot.
func legend(b *strings.Builder, i int, s series) {
	dash := ""
	if s.dash {
		dash = ` stroke-dasharray="6 4"`
	}
	ly := padT + 10 + 20*i
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", padL+plotW+12, ly, padL+plotW+40, ly, s.color, dash)
	fmt.Fprintf(b, `<text x="%d" y="%d" %s>%s</text>`+"\n", padL+plotW+46, ly+4, fontAttrs, esc(s.name))
}

// lineChart writes an SVG line chart; logX and logY put an axis on a log10
// scale (points at or below 0 are left out there).
func lineChart(path, title, xlabel, ylabel string, logX, logY bool, ss []series) error {
	xlo, xhi := span(ss, false, logX)
	x := newAxis(xlo, xhi, logX, 8)
	ylo, yhi := span(ss, true, logY)
	y := newAxis(ylo, yhi, logY, 6)
	var b strings.Builder
	frame(&b, title, xlabel, ylabel, x, y, nil, nil)
	for i, s := range ss {
		var pts []string
		for j := range s.xs {
			if logX && s.xs[j] <= 0 || logY && s.ys[j] <= 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(x, s.xs[j]), py(y, s.ys[j])))
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		legend(&b, i, s)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// barChart writes an SVG chart of grouped bars: one group per category,
// one bar per series (its ys by category; NaN for none), each labelled with
// its value. logY suits values that span decades.
func barChart(path, title, xlabel, ylabel string, categories []string, logY bool, ss []series) error {
	ylo, yhi := span(ss, true, logY)
	y := newAxis(ylo, yhi, logY, 6)
	x := axis{lo: 0, hi: float64(len(categories))}
	var xs []float64
	for i := range categories {
		xs = append(xs, float64(i)+0.5)
	}
	var b strings.Builder
	frame(&b, title, xlabel, ylabel, x, y, xs, categories)
	group := float64(plotW) / float64(len(categories))
	bar := group * 0.8 / float64(max(len(ss), 1))
	for i, s := range ss {
		for j, v := range s.ys {
			if math.IsNaN(v) || logY && v <= 0 {
				continue
			}
			left := padL + group*float64(j) + group*0.1 + bar*float64(i)
			top := py(y, v)
			base := py(y, y.lo)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", left, top, bar-2, base-top, s.color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-family="sans-serif" font-size="10" text-anchor="middle">%s</text>`+"\n", left+bar/2-1, top-3, fmtValue(v))
		}
		legend(&b, i, s)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// fmtValue is a value with three significant digits at most, k for
// thousands.
func fmtValue(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
