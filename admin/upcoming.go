package admin

import (
	"net/http"
	"time"
)

// upcomingRanges are the ranges of GET /api/upcoming between "overdue" and
// "later", each ending at an offset from the current minute and starting
// where the previous one ends.
var upcomingRanges = []struct {
	name  string
	until time.Duration
}{
	{"next_minute", time.Minute},
	{"next_hour", time.Hour},
	{"next_day", 24 * time.Hour},
	{"next_week", 7 * 24 * time.Hour},
}

// upcoming answers GET /api/upcoming: the stored messages of every vhost by
// due time, in ranges that start at the current whole minute (so that a
// store counting by minute counts exactly): overdue is due before it,
// next_minute within it, and so on. Messages of deleted exchanges that
// await discarding are counted too (Engine.Upcoming).
func (s *Server) upcoming(w http.ResponseWriter, r *http.Request) {
	now := s.now()
	start := now.Truncate(time.Minute)
	bounds := []int64{start.UnixMilli()}
	for _, u := range upcomingRanges {
		bounds = append(bounds, start.Add(u.until).UnixMilli())
	}
	counts := s.opts.Engine.Upcoming(bounds)
	if len(counts) != len(bounds)+1 {
		s.log.Error("admin API: Engine.Upcoming answered the wrong number of counts", "bounds", len(bounds), "counts", len(counts))
		writeError(w, http.StatusInternalServerError, "upcoming: %d counts for %d ranges", len(counts), len(bounds)+1)
		return
	}
	out := Upcoming{Now: formatMs(now.UnixMilli()), NowMs: now.UnixMilli()}
	for i, n := range counts {
		rg := UpcomingRange{Count: n}
		switch i {
		case 0:
			rg.Name = "overdue"
		case len(counts) - 1:
			rg.Name = "later"
		default:
			rg.Name = upcomingRanges[i-1].name
		}
		if i > 0 {
			rg.From, rg.FromMs = formatMs(bounds[i-1]), bounds[i-1]
		}
		if i < len(bounds) {
			rg.Until, rg.UntilMs = formatMs(bounds[i]), bounds[i]
		}
		out.Ranges = append(out.Ranges, rg)
		out.Total += n
	}
	writeJSON(w, http.StatusOK, out)
}
