//go:build brokerfaults

package e2e

import (
	"testing"
	"time"
)

// nextDue is the admin API's due time of the next pending message of a
// delayed exchange in vhost "/"; false when none is pending.
func (tp *testProxy) nextDue(t testing.TB, exchange string) (time.Time, bool) {
	t.Helper()
	ms := tp.exchangeIn(t, "/", exchange).NextDueMs
	return time.UnixMilli(ms), ms > 0
}
