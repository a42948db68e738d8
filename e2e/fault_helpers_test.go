//go:build brokerfaults

package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// nextDue is the admin API's due time of the next pending message of a
// delayed exchange in vhost "/"; false when none is pending.
func (tp *testProxy) nextDue(t testing.TB, exchange string) (time.Time, bool) {
	t.Helper()
	code, body := tp.httpDo(t, http.MethodGet, exchangePath(exchange))
	if code != http.StatusOK {
		t.Fatalf("GET exchange %s: %d %s", exchange, code, body)
	}
	var e struct {
		NextDueMs int64 `json:"next_due_ms"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("GET exchange %s: %v: %s", exchange, err, body)
	}
	return time.UnixMilli(e.NextDueMs), e.NextDueMs > 0
}
