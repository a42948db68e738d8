package e2e

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricsSnapshot is one scrape of a proxy's /metrics, by family name.
type metricsSnapshot map[string]*dto.MetricFamily

// scrape reads the proxy's /metrics in the text exposition format.
func scrape(t testing.TB, tp *testProxy) metricsSnapshot {
	t.Helper()
	resp, err := http.Get(tp.HTTP() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: not the text format: %v", err)
	}
	return mfs
}

// lookup returns the value of the series of family name whose labels
// include the given name, value pairs: a counter's, gauge's or untyped
// value, or a histogram's sample count. false when there is no such series.
func (s metricsSnapshot) lookup(name string, labels ...string) (float64, bool) {
	mf, ok := s[name]
	if !ok {
		return 0, false
	}
	m := s.series(mf, labels)
	if m == nil {
		return 0, false
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount()), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

func (s metricsSnapshot) series(mf *dto.MetricFamily, labels []string) *dto.Metric {
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
					break
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// get is lookup that fails the test when the series is absent.
func (s metricsSnapshot) get(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.lookup(name, labels...)
	if !ok {
		t.Fatalf("/metrics has no series %s%v", name, labels)
	}
	return v
}

// want checks one series' value (a histogram's count).
func (s metricsSnapshot) want(t testing.TB, name string, want float64, labels ...string) {
	t.Helper()
	if got := s.get(t, name, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// histSum is a histogram's sum of observations.
func (s metricsSnapshot) histSum(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mf, ok := s[name]
	if !ok || mf.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("/metrics has no histogram %s", name)
	}
	m := s.series(mf, labels)
	if m == nil {
		t.Fatalf("/metrics has no series %s%v", name, labels)
	}
	return m.GetHistogram().GetSampleSum()
}
