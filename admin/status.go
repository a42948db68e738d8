package admin

import (
	"net/http"
	"sort"

	"github.com/delayproxy/delayproxy/metrics"
)

// status answers GET /api/status.
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	now := s.now()
	snap := s.opts.Metrics.Snapshot()
	out := Status{
		Now: formatMs(now.UnixMilli()), NowMs: now.UnixMilli(), Version: s.opts.Version,
		Totals: Totals{
			Stored: int64(snap.Stored), Released: int64(snap.Released), Refused: int64(snap.Refused),
			Discarded: int64(snap.Discarded), Cancelled: int64(snap.Cancelled), Unroutable: int64(snap.Unroutable),
		},
		Connections: Connections{Clients: int64(snap.ClientConnections), Channels: int64(snap.Channels)},
		Releaser: ReleaserStatus{
			Overdue: snap.Overdue, OldestOverdueSeconds: snap.OldestOverdue.Seconds(),
			Reconnects: int64(snap.UpstreamReconnects),
			VHosts:     s.vhosts(),
			Nodes:      []ReleaserNode{{Name: s.node, Self: true, Releases: "all"}},
		},
		Series: RateSeries{IntervalSeconds: statusEvery.Seconds(), Points: []Rates{}},
	}
	samples := s.hist.all()
	for i := 1; i < len(samples); i++ {
		out.Series.Points = append(out.Series.Points, rateBetween(samples[i-1], samples[i]))
	}
	if len(samples) >= 2 {
		win := rateBetween(samples[0], samples[len(samples)-1])
		out.Window = &win
	}
	writeJSON(w, http.StatusOK, out)
}

// vhosts lists the distinct vhosts of the delayed exchanges, sorted.
func (s *Server) vhosts() []string {
	seen := map[string]bool{}
	out := []string{}
	for _, d := range s.opts.Engine.Exchanges() {
		if !seen[d.VHost] {
			seen[d.VHost] = true
			out = append(out, d.VHost)
		}
	}
	sort.Strings(out)
	return out
}

// rateBetween is what happened from sample a to the later sample b.
func rateBetween(a, b sample) Rates {
	secs := b.at.Sub(a.at).Seconds()
	per := func(x, y float64) float64 {
		if secs <= 0 {
			return 0
		}
		return max(y-x, 0) / secs
	}
	out := Rates{
		From: formatMs(a.at.UnixMilli()), FromMs: a.at.UnixMilli(),
		Until: formatMs(b.at.UnixMilli()), UntilMs: b.at.UnixMilli(),
		Seconds:           secs,
		StoredPerSecond:   per(a.snap.Stored, b.snap.Stored),
		ReleasedPerSecond: per(a.snap.Released, b.snap.Released),
		RefusedPerSecond:  per(a.snap.Refused, b.snap.Refused),
	}
	late := b.snap.Lateness.Sub(a.snap.Lateness)
	out.Releases = int64(late.Count)
	out.LatenessP50 = quantile(late, 0.5)
	out.LatenessP99 = quantile(late, 0.99)
	return out
}

func quantile(h metrics.Histogram, q float64) *float64 {
	v, ok := h.Quantile(q)
	if !ok {
		return nil
	}
	return &v
}
