package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// table writes aligned columns for people; call flush at the end.
func (r *cliRun) table() *tabwriter.Writer {
	return tabwriter.NewWriter(r.stdout, 0, 8, 2, ' ', 0)
}

// row writes one tab-separated row.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// printJSON writes v as indented JSON, as the API does.
func (r *cliRun) printJSON(v any) error {
	enc := json.NewEncoder(r.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// dueIn says how long until a due time, for people: "59m58s", or
// "overdue 3s"; "" for no due time.
func dueIn(dueMs int64, now time.Time) string {
	if dueMs == 0 {
		return ""
	}
	d := time.UnixMilli(dueMs).Sub(now)
	if d < 0 {
		return "overdue " + shortDuration(-d)
	}
	return shortDuration(d)
}

// shortDuration writes d in its two largest units, rounded down: "3d4h",
// "59m58s", "45s", "0s".
func shortDuration(d time.Duration) string {
	units := []struct {
		name string
		size time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}}
	for i, u := range units {
		if d < u.size {
			continue
		}
		s := fmt.Sprintf("%d%s", d/u.size, u.name)
		if i+1 < len(units) {
			next := units[i+1]
			if n := d % u.size / next.size; n > 0 {
				s += fmt.Sprintf("%d%s", n, next.name)
			}
		}
		return s
	}
	return "0s"
}

// exchangeCell is an exchange's name in a table: the default exchange,
// whose name is empty, is "(default)", as on the status page.
func exchangeCell(name string) string {
	if name == "" {
		return "(default)"
	}
	return name
}

// orDash is s, or "-" for an empty cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
