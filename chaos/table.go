package chaos

import (
	"fmt"
	"io"
	"strings"
)

// WriteTable prints the results as a Markdown table, then each scenario's
// notes and problems.
func WriteTable(w io.Writer, results []Result) {
	fmt.Fprintln(w, "| scenario | runs | events | lost | duplicated | max recovery s | peak RSS MB | order errors | confirm > ack | result |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range results {
		lost := fmt.Sprint(r.Lost)
		if r.LostNA {
			lost = fmt.Sprintf("n/a (%d)", r.Lost)
		}
		verdict := "ok"
		if r.Failed() {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s | %d | %.1f | %.0f | %d | %d | %s |\n", r.Name, r.Runs, r.Events, lost, r.Duplicates,
			r.MaxRecovery, float64(r.PeakRSSKB)/1024, r.Report.OrderErrors, r.Report.LSNViolations, verdict)
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "%s:\n", r.Name)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
		if r.Err != nil {
			fmt.Fprintf(w, "  - ERROR: %s\n", strings.ReplaceAll(r.Err.Error(), "\n", "\n    "))
		}
		for _, e := range r.Report.Examples {
			fmt.Fprintf(w, "  - example: %s\n", e)
		}
		if r.Failed() && r.Log != "" {
			fmt.Fprintf(w, "  - outboxd log: %s\n", r.Log)
		}
	}
}
