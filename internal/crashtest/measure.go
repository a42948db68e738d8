package crashtest

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/rawamqp"
)

// Counts are process-wide counters at one moment.
type Counts struct {
	Goroutines int
	FDs        int
}

// LoadReport is what MeasureLoad found.
type LoadReport struct {
	Conns    int           // client connections
	Dial     time.Duration // to open all of them
	Active   LoadResult    // what they did
	Baseline Counts        // before the first connection
	// AfterActive and AfterIdle are the counts once the active clients,
	// then the idle ones, have closed and the proxy had up to SettleTime to
	// notice: equal to Baseline unless something leaked.
	AfterActive, AfterIdle Counts
	// Per idle connection (raw clients, handshake done, no channel): the
	// proxy's goroutines, Go memory in use (heap after GC plus goroutine
	// stacks) and resident memory.
	IdleGoroutines float64
	IdleGoBytes    float64
	IdleRSSBytes   float64
}

// SettleTime is how long MeasureLoad waits for goroutines and descriptors
// of closed connections to go.
const SettleTime = 20 * time.Second

// MeasureLoad runs, against a proxy in this process at proxyURL whose
// exchanges and queues l names:
//
//  1. n amqp091-go clients doing l for d, then closing;
//  2. n raw clients connected and idle, measured, then closing.
//
// It counts goroutines and file descriptors before, and after each phase
// once they have settled (a leak shows as counts above the baseline). The
// caller must keep everything else in the process steady meanwhile: no
// parallel tests, no HTTP keep-alive connections coming and going.
func MeasureLoad(proxyURL, name string, n int, l Load, d time.Duration) (LoadReport, error) {
	rep := LoadReport{Conns: n}
	u, err := url.Parse(proxyURL)
	if err != nil {
		return rep, err
	}
	rep.Baseline = Counts{Goroutines: Steady(runtime.NumGoroutine), FDs: Steady(FDs)}

	start := time.Now()
	cs, err := OpenClients(proxyURL, name, n)
	if err != nil {
		return rep, err
	}
	rep.Dial = time.Since(start)
	rep.Active = cs.Run(l, d)
	cs.Close()
	rep.AfterActive = settle(rep.Baseline)

	heap0, stack0 := Mem()
	rss0 := FloorRSS()
	g0 := runtime.NumGoroutine()
	idle, err := OpenIdle(u.Host, n, rawamqp.Login{User: u.User.Username(), Pass: password(u)})
	if err != nil {
		return rep, err
	}
	g1 := Steady(runtime.NumGoroutine)
	heap1, stack1 := Mem()
	rss1 := FloorRSS()
	CloseIdle(idle)
	rep.IdleGoroutines = float64(g1-g0) / float64(n)
	rep.IdleGoBytes = (float64(heap1+stack1) - float64(heap0+stack0)) / float64(n)
	rep.IdleRSSBytes = float64(rss1-rss0) / float64(n)
	rep.AfterIdle = settle(rep.Baseline)
	return rep, nil
}

func password(u *url.URL) string {
	p, _ := u.User.Password()
	return p
}

// settle waits up to SettleTime for the counts to come back to base.
func settle(base Counts) Counts {
	return Counts{
		Goroutines: Settle(SettleTime, base.Goroutines, runtime.NumGoroutine),
		FDs:        Settle(SettleTime, base.FDs, FDs),
	}
}

// Leaks describes counts above the baseline after each phase, with the
// goroutines and descriptors then open; "" when there are none.
func (r LoadReport) Leaks() string {
	var s string
	for _, c := range []struct {
		phase string
		got   Counts
	}{{"active", r.AfterActive}, {"idle", r.AfterIdle}} {
		if c.got.Goroutines > r.Baseline.Goroutines {
			s += fmt.Sprintf("%d goroutines after the %s clients closed, %d before\n", c.got.Goroutines, c.phase, r.Baseline.Goroutines)
		}
		if c.got.FDs > r.Baseline.FDs {
			s += fmt.Sprintf("%d file descriptors after the %s clients closed, %d before\n", c.got.FDs, c.phase, r.Baseline.FDs)
		}
	}
	if s != "" {
		s += "goroutines:\n" + Goroutines() + "file descriptors:\n" + OpenFDs()
	}
	return s
}

// String summarises the report for a log.
func (r LoadReport) String() string {
	return fmt.Sprintf("%d connections opened in %v; %d delayed confirmed (%d nacked), %d plain published, %d acked by consumers; "+
		"baseline %d goroutines/%d fds, after active %d/%d, after idle %d/%d; "+
		"per idle connection: %.1f goroutines, %.0f B Go memory (heap+stacks), %.0f B RSS",
		r.Conns, r.Dial.Round(time.Millisecond), len(r.Active.Confirmed), r.Active.Nacked, r.Active.Plain, r.Active.Acked,
		r.Baseline.Goroutines, r.Baseline.FDs, r.AfterActive.Goroutines, r.AfterActive.FDs, r.AfterIdle.Goroutines, r.AfterIdle.FDs,
		r.IdleGoroutines, r.IdleGoBytes, r.IdleRSSBytes)
}

// BrokerRoom is how many more connections RabbitMQ can take, from
// rabbitmqctl status: the smaller of its free sockets and free file
// descriptors. RabbitMQ's limits follow the ulimit it was started with
// (1024 descriptors give 832 sockets).
func BrokerRoom(t testing.TB) (room, socketsLimit int) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "status", "--formatter", "json").Output()
	if err != nil {
		t.Fatalf("crashtest: rabbitmqctl status: %v", err)
	}
	var st struct {
		FD struct {
			SocketsLimit int `json:"sockets_limit"`
			SocketsUsed  int `json:"sockets_used"`
			TotalLimit   int `json:"total_limit"`
			TotalUsed    int `json:"total_used"`
		} `json:"file_descriptors"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("crashtest: rabbitmqctl status: %v", err)
	}
	fd := st.FD
	return min(fd.SocketsLimit-fd.SocketsUsed, fd.TotalLimit-fd.TotalUsed), fd.SocketsLimit
}
