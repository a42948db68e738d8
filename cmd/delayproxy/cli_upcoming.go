package main

import (
	"context"
	"flag"
	"strconv"
)

var upcomingCommand = &cliCommand{
	name:    "upcoming",
	summary: "count stored messages by when they are due",
	about: `Counts the messages the proxy holds, of every vhost, by due time: overdue
(due before the current minute, not yet released), due within the current
minute, from then to an hour, to a day, to a week, and later. The ranges
start at the current whole minute and do not overlap. Messages of a deleted
exchange count until they are discarded at their due time.`,
	vhost: "-",
	flags: func(fs *flag.FlagSet) func(context.Context, *cliRun) error {
		return upcoming
	},
}

// rangeLabels name the API's ranges in the table.
var rangeLabels = map[string]string{
	"overdue":     "overdue",
	"next_minute": "< 1m",
	"next_hour":   "1m - 1h",
	"next_day":    "1h - 1d",
	"next_week":   "1d - 7d",
	"later":       ">= 7d",
}

func upcoming(ctx context.Context, r *cliRun) error {
	u, err := r.client.upcoming(ctx)
	if err != nil {
		return err
	}
	if r.json {
		return r.printJSON(u)
	}
	t := r.table()
	row(t, "DUE IN", "MESSAGES")
	for _, rg := range u.Ranges {
		label := rangeLabels[rg.Name]
		if label == "" {
			label = rg.Name
		}
		row(t, label, strconv.FormatInt(rg.Count, 10))
	}
	row(t, "total", strconv.FormatInt(u.Total, 10))
	return t.Flush()
}
