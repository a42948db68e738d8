package admin

import (
	"net/http"
	"time"
)

// upcomingRanges are the ranges of GET /api/upcoming between "overdue"
// (due before now) and "later" (due a week from now or after), each
// ending at an offset from now and starting where the previous one ends.
var upcomingRanges = []struct {
	name  string
	until time.Duration
}{
	{"next_minute", time.Minute},
	{"next_hour", time.Hour},
	{"next_day", 24 * time.Hour},
	{"next_week", 7 * 24 * time.Hour},
}

// upcomingJSON is the answer of GET /api/upcoming.
type upcomingJSON struct {
	Now     string      `json:"now"` // RFC 3339, UTC, milliseconds: the start of next_minute
	NowMs   int64       `json:"now_ms"`
	Ranges  []rangeJSON `json:"ranges"`  // overdue, next_minute, next_hour, next_day, next_week, later
	Pending int64       `json:"pending"` // the sum of the counts
}

// rangeJSON is one range of due times, [from, until); overdue has no
// from, later no until.
type rangeJSON struct {
	Name    string `json:"name"`
	From    string `json:"from,omitempty"`
	FromMs  int64  `json:"from_ms,omitempty"`
	Until   string `json:"until,omitempty"`
	UntilMs int64  `json:"until_ms,omitempty"`
	Count   int64  `json:"count"`
}

// upcoming answers GET /api/upcoming: pending messages of every vhost by
// due time, in disjoint ranges relative to now.
func (s *Server) upcoming(w http.ResponseWriter, r *http.Request) {
	now := s.now()
	nowMs := now.UnixMilli()
	bounds := []int64{0, nowMs}
	for _, u := range upcomingRanges {
		bounds = append(bounds, now.Add(u.until).UnixMilli())
	}
	counts, err := s.opts.Engine.Upcoming(bounds)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if len(counts) != len(bounds) {
		s.log.Error("admin API: Engine.Upcoming answered the wrong number of counts", "bounds", len(bounds), "counts", len(counts))
		writeError(w, http.StatusInternalServerError, "upcoming: %d counts for %d ranges", len(counts), len(bounds))
		return
	}
	out := upcomingJSON{Now: formatMs(nowMs), NowMs: nowMs}
	for i, n := range counts {
		rg := rangeJSON{Count: n}
		switch i {
		case 0:
			rg.Name = "overdue"
		case len(counts) - 1:
			rg.Name = "later"
		default:
			rg.Name = upcomingRanges[i-1].name
		}
		if i > 0 {
			rg.From, rg.FromMs = formatMs(bounds[i]), bounds[i]
		}
		if i < len(bounds)-1 {
			rg.Until, rg.UntilMs = formatMs(bounds[i+1]), bounds[i+1]
		}
		out.Ranges = append(out.Ranges, rg)
		out.Pending += n
	}
	writeJSON(w, http.StatusOK, out)
}
