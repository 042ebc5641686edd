package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// statusOrder puts the well-known /status fields first, in this order, at
// any depth; other keys follow alphabetically.
var statusOrder = []string{
	"state", "last_error",
	"name", "plugin", "active", "active_pid", "wal_status", "confirmed_flush_lsn", "restart_lsn", "safe_wal_size",
	"slot", "server_wal_lsn", "retained_wal_bytes", "unconfirmed_bytes", "lag_seconds",
	"in_flight", "counters", "topics", "kafka",
}

// formatStatus prints a JSON object as "key: value" lines, nested objects
// flattened with dots and byte counts also humanized.
func formatStatus(w io.Writer, body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("decode status: %w", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("decode status: expected a JSON object, got %s", strings.TrimSpace(string(body)))
	}
	var lines []string
	flatten("", v, &lines)
	_, err := io.WriteString(w, strings.Join(lines, "\n")+"\n")
	return err
}

func flatten(key string, v any, lines *[]string) {
	join := func(k string) string {
		if key == "" {
			return k
		}
		return key + "." + k
	}
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 && key != "" {
			*lines = append(*lines, key+": {}")
		}
		for _, k := range sortStatusKeys(v) {
			flatten(join(k), v[k], lines)
		}
	case []any:
		if len(v) == 0 {
			*lines = append(*lines, key+": []")
		}
		for i, e := range v {
			flatten(fmt.Sprintf("%s[%d]", key, i), e, lines)
		}
	default:
		*lines = append(*lines, key+": "+scalar(key, v))
	}
}

func sortStatusKeys(m map[string]any) []string {
	rank := func(k string) int {
		for i, s := range statusOrder {
			if s == k {
				return i
			}
		}
		return len(statusOrder)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		ri, rj := rank(keys[i]), rank(keys[j])
		if ri != rj {
			return ri < rj
		}
		return keys[i] < keys[j]
	})
	return keys
}

func scalar(key string, v any) string {
	switch v := v.(type) {
	case nil:
		return "(none)"
	case string:
		if strings.ContainsAny(v, "\n\r") {
			return strconv.Quote(v)
		}
		return v
	case json.Number:
		if isByteCount(key) {
			if n, err := v.Int64(); err == nil {
				return fmt.Sprintf("%s (%s)", v, humanBytes(n))
			}
		}
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}

// isByteCount: fields named *bytes or *_size (safe_wal_size) count bytes.
func isByteCount(key string) bool {
	last := key[strings.LastIndex(key, ".")+1:]
	return strings.HasSuffix(last, "bytes") || strings.HasSuffix(last, "_size")
}

// humanBytes is n in B, KiB, MiB, GiB or TiB with one decimal.
func humanBytes(n int64) string {
	abs := n
	if abs < 0 {
		abs = -abs
	}
	if abs < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= 1024
		if f < 1024 && f > -1024 || unit == "TiB" {
			return fmt.Sprintf("%.1f %s", f, unit)
		}
	}
	return ""
}
