package admin

import (
	"net/http"
	"sort"

	"github.com/delayproxy/delayproxy/metrics"
)

// statusJSON is the answer of GET /api/status: what the status page shows
// besides the exchanges and the upcoming releases.
type statusJSON struct {
	Now         string         `json:"now"` // RFC 3339, UTC, milliseconds
	NowMs       int64          `json:"now_ms"`
	Version     string         `json:"version,omitempty"`
	Totals      totalsJSON     `json:"totals"`
	Connections connectionJSON `json:"connections"`
	Releaser    releaserJSON   `json:"releaser"`
	// Window is over the whole history (up to 5 minutes); null until a
	// second sample is taken, statusEvery after Start.
	Window *rateJSON  `json:"window"`
	Series seriesJSON `json:"series"`
}

// totalsJSON are the counters since the process started, read now.
type totalsJSON struct {
	Stored     int64 `json:"stored"`
	Released   int64 `json:"released"`
	Refused    int64 `json:"refused"`
	Discarded  int64 `json:"discarded"`
	Cancelled  int64 `json:"cancelled"`
	Unroutable int64 `json:"unroutable"`
}

// connectionJSON are the client connections and channels open now.
type connectionJSON struct {
	Clients  int64 `json:"clients"`
	Channels int64 `json:"channels"`
}

// releaserJSON is the releaser's state now.
type releaserJSON struct {
	Overdue              int64   `json:"overdue"` // due, not yet released (measured about once a second)
	OldestOverdueSeconds float64 `json:"oldest_overdue_seconds"`
	Reconnects           int64   `json:"reconnects"` // to RabbitMQ, since start
	// VHosts are the vhosts of the delayed exchanges: where releases go,
	// one connection each.
	VHosts []string `json:"vhosts"`
	// Nodes say which node releases what: this process, everything, until
	// there is a cluster mode.
	Nodes []nodeJSON `json:"nodes"`
}

// nodeJSON is one node of the releaser.
type nodeJSON struct {
	Name     string `json:"name"`
	Self     bool   `json:"self"`
	Releases string `json:"releases"` // "all"
}

// rateJSON is what happened between two samples.
type rateJSON struct {
	From              string  `json:"from"`
	FromMs            int64   `json:"from_ms"`
	Until             string  `json:"until"`
	UntilMs           int64   `json:"until_ms"`
	Seconds           float64 `json:"seconds"`
	StoredPerSecond   float64 `json:"stored_per_second"`
	ReleasedPerSecond float64 `json:"released_per_second"`
	RefusedPerSecond  float64 `json:"refused_per_second"`
	// Releases is how many releases the lateness quantiles are over; they
	// are null when there were none. Estimated from the histogram's
	// buckets as Prometheus's histogram_quantile does.
	Releases    int64    `json:"releases"`
	LatenessP50 *float64 `json:"lateness_p50_seconds"`
	LatenessP99 *float64 `json:"lateness_p99_seconds"`
}

// seriesJSON are the rates of each interval between consecutive samples,
// oldest first.
type seriesJSON struct {
	IntervalSeconds float64    `json:"interval_seconds"`
	Points          []rateJSON `json:"points"`
}

// status answers GET /api/status.
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	now := s.now()
	snap := s.opts.Metrics.Snapshot()
	out := statusJSON{
		Now: formatMs(now.UnixMilli()), NowMs: now.UnixMilli(), Version: s.opts.Version,
		Totals: totalsJSON{
			Stored: int64(snap.Stored), Released: int64(snap.Released), Refused: int64(snap.Refused),
			Discarded: int64(snap.Discarded), Cancelled: int64(snap.Cancelled), Unroutable: int64(snap.Unroutable),
		},
		Connections: connectionJSON{Clients: int64(snap.ClientConnections), Channels: int64(snap.Channels)},
		Releaser: releaserJSON{
			Overdue: snap.Overdue, OldestOverdueSeconds: snap.OldestOverdue.Seconds(),
			Reconnects: int64(snap.UpstreamReconnects),
			VHosts:     s.vhosts(),
			Nodes:      []nodeJSON{{Name: s.node, Self: true, Releases: "all"}},
		},
		Series: seriesJSON{IntervalSeconds: statusEvery.Seconds(), Points: []rateJSON{}},
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
func rateBetween(a, b sample) rateJSON {
	secs := b.at.Sub(a.at).Seconds()
	per := func(x, y float64) float64 {
		if secs <= 0 {
			return 0
		}
		return max(y-x, 0) / secs
	}
	out := rateJSON{
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
