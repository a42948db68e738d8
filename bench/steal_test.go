package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// stealMeter reads how much of the machine's CPU time the hypervisor gave
// to others (steal time, /proc/stat) over a benchmark: on a virtual
// machine whose host is busy, a run's latencies and ratios move with it,
// so the figure tells a disturbed run from a quiet one. It reports nothing
// where /proc/stat cannot be read.
type stealMeter struct {
	total, steal uint64
	ok           bool
}

// startSteal reads the counters now.
func startSteal() stealMeter {
	var m stealMeter
	m.total, m.steal, m.ok = cpuTicks()
	return m
}

// report adds "steal-%": the share of CPU time stolen since start.
func (m stealMeter) report(b *testing.B) {
	total, steal, ok := cpuTicks()
	if !m.ok || !ok || total <= m.total {
		return
	}
	b.ReportMetric(100*float64(steal-m.steal)/float64(total-m.total), "steal-%")
}

// cpuTicks returns the machine's total and steal CPU time, in ticks, from
// the first line of /proc/stat: "cpu user nice system idle iowait irq
// softirq steal ...".
func cpuTicks() (total, steal uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	fields := strings.Fields(line)
	if err != nil || len(fields) < 9 || fields[0] != "cpu" {
		return 0, 0, false
	}
	// The eight fields up to steal; guest time, after them, is counted in
	// user and nice already.
	for i, s := range fields[1:9] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i == 7 {
			steal = n
		}
	}
	return total, steal, true
}
