package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Collector is an OpenTelemetry Collector that otelcol.sh started on
// loopback: OTLP/HTTP in, every span written to a file.
type Collector struct {
	Endpoint string // OTLP/HTTP base URL
	spans    string
	dir      string
}

// StartCollector starts a collector with its state in dir (built from
// testenv/otelcol the first time on a machine).
func StartCollector(dir string) (*Collector, error) {
	if err := guard("otelcol.sh", "stop", dir); err != nil {
		return nil, err
	}
	out, err := runScript(context.Background(), nil, "otelcol.sh", "start", dir)
	if err != nil {
		return nil, err
	}
	c := &Collector{dir: dir}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "OTELCOL_ENDPOINT="); ok {
			c.Endpoint = v
		}
		if v, ok := strings.CutPrefix(line, "OTELCOL_SPANS="); ok {
			c.spans = v
		}
	}
	if c.Endpoint == "" || c.spans == "" {
		return nil, fmt.Errorf("otelcol.sh start printed no OTELCOL_ENDPOINT or OTELCOL_SPANS:\n%s", out)
	}
	return c, nil
}

// Stop stops it.
func (c *Collector) Stop() error {
	_, err := runScript(context.Background(), nil, "otelcol.sh", "stop", c.dir)
	if err == nil {
		unguard("otelcol.sh", "stop", c.dir)
	}
	return err
}

// Span is one span as the collector received it.
type Span struct {
	Service      string // its resource's service.name
	TraceID      string
	SpanID       string
	ParentSpanID string
	Name         string
	Kind         int // 4: producer
	Start, End   int64
	Attributes   map[string]string // every value as text
	StatusCode   int               // 2: error
	Status       string
}

// Spans reads every span the collector has written so far.
func (c *Collector) Spans() ([]Span, error) {
	f, err := os.Open(c.spans)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type value struct {
		StringValue *string `json:"stringValue"`
		IntValue    *string `json:"intValue"`
		BoolValue   *bool   `json:"boolValue"`
	}
	type kv struct {
		Key   string `json:"key"`
		Value value  `json:"value"`
	}
	text := func(v value) string {
		switch {
		case v.StringValue != nil:
			return *v.StringValue
		case v.IntValue != nil:
			return *v.IntValue
		case v.BoolValue != nil:
			return strconv.FormatBool(*v.BoolValue)
		}
		return ""
	}
	var export struct {
		ResourceSpans []struct {
			Resource struct {
				Attributes []kv `json:"attributes"`
			} `json:"resource"`
			ScopeSpans []struct {
				Spans []struct {
					TraceID      string `json:"traceId"`
					SpanID       string `json:"spanId"`
					ParentSpanID string `json:"parentSpanId"`
					Name         string `json:"name"`
					Kind         int    `json:"kind"`
					Start        string `json:"startTimeUnixNano"`
					End          string `json:"endTimeUnixNano"`
					Attributes   []kv   `json:"attributes"`
					Status       struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
					} `json:"status"`
				} `json:"spans"`
			} `json:"scopeSpans"`
		} `json:"resourceSpans"`
	}
	var spans []Span
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		export.ResourceSpans = nil
		if err := json.Unmarshal(sc.Bytes(), &export); err != nil {
			// The exporter writes a line at a time; a half-written last
			// line is read again at the next call.
			break
		}
		for _, rs := range export.ResourceSpans {
			service := ""
			for _, a := range rs.Resource.Attributes {
				if a.Key == "service.name" {
					service = text(a.Value)
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					sp := Span{Service: service, TraceID: s.TraceID, SpanID: s.SpanID, ParentSpanID: s.ParentSpanID, Name: s.Name,
						Kind: s.Kind, Attributes: map[string]string{}, StatusCode: s.Status.Code, Status: s.Status.Message}
					sp.Start, _ = strconv.ParseInt(s.Start, 10, 64)
					sp.End, _ = strconv.ParseInt(s.End, 10, 64)
					for _, a := range s.Attributes {
						sp.Attributes[a.Key] = text(a.Value)
					}
					spans = append(spans, sp)
				}
			}
		}
	}
	return spans, sc.Err()
}
