package main

import (
	"fmt"
	"math"
	"os"
	"strings"
)

// series is one line of a chart.
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
		return fmt.Sprintf("%g", v)
	}
}

// lineChart writes an SVG line chart; logX puts x on a log10 scale.
func lineChart(path, title, xlabel, ylabel string, logX bool, ss []series) error {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), 0.0, math.Inf(-1)
	for _, s := range ss {
		for i := range s.xs {
			x := s.xs[i]
			if logX && x <= 0 {
				continue
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymax = math.Max(ymax, s.ys[i])
		}
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax, ymax = 0, 1, 1
	}
	var xt []float64
	if logX {
		lo, hi := math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
		if hi == lo {
			hi++
		}
		xmin, xmax = math.Pow(10, lo), math.Pow(10, hi)
		for e := lo; e <= hi; e++ {
			for _, m := range []float64{1, 2, 5} {
				if v := m * math.Pow(10, e); v <= xmax {
					xt = append(xt, v)
				}
			}
		}
	} else {
		xmin = 0
		xt = niceTicks(xmin, xmax, 8)
		xmax = xt[len(xt)-1]
	}
	yt := niceTicks(ymin, ymax, 6)
	ymax = yt[len(yt)-1]
	px := func(x float64) float64 {
		if logX {
			return padL + plotW*(math.Log10(x)-math.Log10(xmin))/(math.Log10(xmax)-math.Log10(xmin))
		}
		return padL + plotW*(x-xmin)/(xmax-xmin)
	}
	py := func(y float64) float64 { return padT + plotH*(1-(y-ymin)/(ymax-ymin)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-family="sans-serif" font-size="15" font-weight="bold">%s</text>`+"\n", padL, esc(title))
	for _, v := range xt {
		x := px(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, padT, x, padT+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" %s text-anchor="middle">%s</text>`+"\n", x, padT+plotH+18, fontAttrs, fmtTick(v))
	}
	for _, v := range yt {
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", padL, y, padL+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" %s text-anchor="end">%s</text>`+"\n", padL-6, y+4, fontAttrs, fmtTick(v))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", padL, padT, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s text-anchor="middle">%s</text>`+"\n", padL+plotW/2, svgH-10, fontAttrs, esc(xlabel))
	fmt.Fprintf(&b, `<text x="16" y="%d" %s text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n", padT+plotH/2, fontAttrs, padT+plotH/2, esc(ylabel))
	for i, s := range ss {
		var pts []string
		for j := range s.xs {
			if logX && s.xs[j] <= 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[j]), py(s.ys[j])))
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		ly := padT + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", padL+plotW+12, ly, padL+plotW+40, ly, s.color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s>%s</text>`+"\n", padL+plotW+46, ly+4, fontAttrs, esc(s.name))
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
