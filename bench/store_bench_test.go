package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	bolt "go.etcd.io/bbolt"
)

// Store benchmarks. Run them with
//
//	go test -run '^$' -bench Store -benchtime 3s -timeout 60m ./bench/
//
// The prefilled files (1M and 5M pending messages, ~1 GB for 5M) are built
// on first use with NoSync and large batches, cached under bench/testdata/
// (gitignored) keyed by their parameters, and copied for every benchmark
// run so each one starts from the same state. Set DELAYPROXY_BENCH_CACHE to
// put the cache elsewhere.

const (
	storeBase    = int64(1_800_000_000_000) // due times are relative to this (the store takes them as given)
	storeSpread  = 24 * 3600_000            // delays random over 0-24 h
	storeBodyLen = 100
	// storeHorizon is where the prefill leaves the cascade watermark, as a
	// scheduler with a one-minute horizon would.
	storeHorizon = 60_000
)

// storeLayout names a file layout; the zero value is the default one.
type storeLayout struct {
	name string
	opts boltstore.Options
}

var defaultLayout = storeLayout{name: "default"}

// BenchmarkStorePut_Parallel1, _Parallel16 and _Parallel256 measure durable
// Put (fsync on): one 100-byte message per call, due at random over 0-24 h,
// from 1, 16 or 256 goroutines, on a store with 1M or 5M messages already
// pending. Target: at least 100,000 msgs/s at 5M pending with 256 writers on
// a 2-core machine (plain bbolt with random keys manages about 14,000/s).
func BenchmarkStorePut_Parallel1(b *testing.B)   { benchStorePutPending(b, 1) }
func BenchmarkStorePut_Parallel16(b *testing.B)  { benchStorePutPending(b, 16) }
func BenchmarkStorePut_Parallel256(b *testing.B) { benchStorePutPending(b, 256) }

func benchStorePutPending(b *testing.B, writers int) {
	for _, pending := range []int{1_000_000, 5_000_000} {
		b.Run(fmt.Sprintf("Pending%dM", pending/1_000_000), func(b *testing.B) {
			benchStorePut(b, defaultLayout, pending, writers, boltstore.Options{})
		})
	}
}

// BenchmarkStorePut_Layouts compares settings at 1M pending with 256
// writers: the default, bbolt's freelist written at every commit, far
// buckets one slot wide (every message a random insert into its own 1 s
// bucket, as a plain slot layout would do), one hour and four hours wide
// (the default is one day).
func BenchmarkStorePut_Layouts(b *testing.B) {
	for _, tc := range []struct {
		layout storeLayout
		opts   boltstore.Options
	}{
		{defaultLayout, boltstore.Options{}},
		{storeLayout{name: "syncfreelist"}, boltstore.Options{SyncFreelist: true}},
		{storeLayout{name: "far1s", opts: boltstore.Options{FarWidth: time.Second}}, boltstore.Options{}},
		{storeLayout{name: "far1h", opts: boltstore.Options{FarWidth: time.Hour}}, boltstore.Options{}},
		{storeLayout{name: "far4h", opts: boltstore.Options{FarWidth: 4 * time.Hour}}, boltstore.Options{}},
	} {
		b.Run(tc.layout.name, func(b *testing.B) {
			benchStorePut(b, tc.layout, 1_000_000, 256, tc.opts)
		})
	}
}

// BenchmarkStorePut_MessageID is Put with a message-id on every message (an
// entry in the ids index besides the message), 256 writers, 1M pending,
// in rounds of 20,000 that alternate with rounds of Puts without one on the
// same store. It reports both rates and their ratio (with / without).
// Target: ratio >= 0.5.
func BenchmarkStorePut_MessageID(b *testing.B) {
	const round = 20_000
	s := openPrefilled(b, defaultLayout, 1_000_000, boltstore.Options{})
	var elapsed [2]time.Duration // without, with
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		for i, withID := range []bool{false, true} {
			elapsed[i] += putParallel(b, s, done, min(round, b.N-done), 256, withID, storeSpread)
		}
	}
	b.StopTimer()
	without, with := float64(b.N)/elapsed[0].Seconds(), float64(b.N)/elapsed[1].Seconds()
	b.ReportMetric(without, "plain-msgs/s")
	b.ReportMetric(with, "id-msgs/s")
	b.ReportMetric(with/without, "ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkStorePut_ShortDelays is Put with delays over 0-60 s (all behind
// the cascade watermark: appends to the tails of the next minute's slots),
// 256 writers, 1M pending further out, with slots 1 s (the default), 5 s
// and 10 s wide.
func BenchmarkStorePut_ShortDelays(b *testing.B) {
	for _, layout := range []storeLayout{
		{name: "Slot1s"},
		{name: "Slot5s", opts: boltstore.Options{SlotWidth: 5 * time.Second}},
		{name: "Slot10s", opts: boltstore.Options{SlotWidth: 10 * time.Second}},
	} {
		b.Run(layout.name, func(b *testing.B) {
			if layout.name == "Slot1s" {
				layout = defaultLayout
			}
			benchStorePutWith(b, layout, 1_000_000, 256, boltstore.Options{}, false, 60_000)
		})
	}
}

func benchStorePut(b *testing.B, layout storeLayout, pending, writers int, opts boltstore.Options) {
	benchStorePutWith(b, layout, pending, writers, opts, false, storeSpread)
}

func benchStorePutWith(b *testing.B, layout storeLayout, pending, writers int, opts boltstore.Options, withID bool, spread int64) {
	s := openPrefilled(b, layout, pending, opts)
	before := s.Stats()
	b.ResetTimer()
	elapsed := putParallel(b, s, 0, b.N, writers, withID, spread)
	b.StopTimer()
	st := s.Stats()
	commits := st.Commits - before.Commits
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(b.N)/float64(max(commits, 1)), "msgs/commit")
	b.ReportMetric(float64(st.CommitTime-before.CommitTime)/float64(max(commits, 1))/1e6, "ms/commit")
	b.ReportMetric(float64(st.PageWrites-before.PageWrites)/float64(max(commits, 1)), "pages/commit")
	b.ReportMetric(float64(st.JournalCommits-before.JournalCommits)/float64(max(commits, 1)), "journaled/commit")
	b.ReportMetric(float64(st.Checkpoints-before.Checkpoints), "checkpoints")
}

// openPrefilled opens a private copy of the prefilled store of layout with
// pending messages; it is closed in b.Cleanup.
func openPrefilled(b *testing.B, layout storeLayout, pending int, opts boltstore.Options) *boltstore.Store {
	b.Helper()
	path := prefilledCopy(b, layout, pending)
	opts.FarWidth, opts.SlotWidth = layout.opts.FarWidth, layout.opts.SlotWidth
	s, err := boltstore.Open(path, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// putParallel stores n messages of exchange "bench", numbered from first,
// one per Put, from writers goroutines, due at random over spread ms past
// the horizon, each with a message-id of its own when withID; it returns
// the time taken.
func putParallel(b *testing.B, s *boltstore.Store, first, n, writers int, withID bool, spread int64) time.Duration {
	bench, _ := s.Exchange("/", "bench")
	body := make([]byte, storeBodyLen)
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(first+n)))
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				delay := r.Int64N(spread)
				m := &store.Message{VHost: "/", Exchange: "bench", RoutingKey: "rk", Body: body,
					Due: storeBase + storeHorizon + delay, Delay: max(delay, 1), Incarnation: bench.Incarnation}
				if withID {
					m.MessageID = fmt.Sprintf("id-%d-%d", w, first+int(i))
				}
				if err := s.Put(ctx, m); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return elapsed
}

// BenchmarkStoreReopen_Pending5M measures a restart: Open a store with 5M
// pending messages and read the first key (NextDue, then the first key of
// ScanKeys). Target: under 1 s. AfterClose opens a file closed by Close
// (which writes bbolt's freelist); AfterCrash one whose last commit did not
// write the freelist, as after a crash, so bbolt rebuilds it by walking every
// page. The page cache is warm (the file was just copied). It also reports
// the file size and the heap the open store holds.
func BenchmarkStoreReopen_Pending5M(b *testing.B) {
	for _, crash := range []bool{false, true} {
		name := "AfterClose"
		if crash {
			name = "AfterCrash"
		}
		b.Run(name, func(b *testing.B) { benchStoreReopen(b, 5_000_000, crash) })
	}
}

func benchStoreReopen(b *testing.B, pending int, crash bool) {
	// One copy per run: a Close leaves the file as it found it (freelist
	// written), and AfterCrash drops the freelist again before each Open.
	path := prefilledCopy(b, defaultLayout, pending)
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var heap float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := setStoreFreelist(path, !crash); err != nil {
			b.Fatal(err)
		}
		heapBefore := crashtest.LiveHeap()
		b.StartTimer()
		s, err := boltstore.Open(path, boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		due, ok := s.NextDue()
		if !ok {
			b.Fatal("NextDue: nothing pending")
		}
		var first store.Key
		if err := s.ScanKeys(due, due+1, func(k store.Key) error { first = k; return store.ErrStop }); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if first.Due() != due {
			b.Fatalf("first key due %d, NextDue %d", first.Due(), due)
		}
		if n := s.Pending(); n != int64(pending) {
			b.Fatalf("Pending %d, want %d", n, pending)
		}
		heap = float64(crashtest.LiveHeap()) - float64(heapBefore)
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(st.Size())/(1<<20), "MB-file")
	b.ReportMetric(heap/(1<<20), "MB-heap-open")
}

// setStoreFreelist commits once with bbolt directly, writing the freelist or
// not: without it the file is in the state a crash leaves.
func setStoreFreelist(path string, write bool) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: !write, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return err
	}
	if err := db.Update(func(*bolt.Tx) error { return nil }); err != nil {
		db.Close()
		return err
	}
	return db.Close()
}

// BenchmarkStoreFsync_Floor is the disk's floor for one bbolt commit: write a
// 4 KiB page at a random place, fdatasync, write the meta page, fdatasync.
// Run it next to the Put benchmarks: msgs/s can't beat batch size divided by
// this, and the ratio tells the store's overhead on a noisy disk.
func BenchmarkStoreFsync_Floor(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "floor"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	const size = 64 << 20
	if _, err := f.WriteAt(make([]byte, 1<<20), size-(1<<20)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	page := make([]byte, 4096)
	r := rand.New(rand.NewPCG(1, 1))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteAt(page, 4096*(1+r.Int64N(size/4096-1))); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		if _, err := f.WriteAt(page, 0); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/commit")
}

// BenchmarkStoreFsync_LogFloor is the disk's floor for one append to the
// store's journal: a full group commit of 256 encoded messages (100-byte
// bodies) written to a preallocated file, then one fdatasync. It reports
// ceiling-msgs/s, 256 messages over that time: what StorePut_Parallel256
// could reach at best with every commit full, before any CPU work and
// without checkpoints.
func BenchmarkStoreFsync_LogFloor(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	const size = 64 << 20
	if _, err := f.Write(make([]byte, size)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	const batch = 256
	commit := make([]byte, batch*(storeBodyLen+store.KeySize+32)) // body, key, headers and framing
	var off int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if off+int64(len(commit)) > size {
			off = 0
		}
		if _, err := f.WriteAt(commit, off); err != nil {
			b.Fatal(err)
		}
		off += int64(len(commit))
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	ms := float64(b.Elapsed().Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(ms, "ms/commit")
	b.ReportMetric(batch/ms*1000, "ceiling-msgs/s")
}

// prefilledCopy returns a private copy of the cached prefilled file: pending
// messages of exchange "/"/"bench", 100-byte bodies, due at random over
// [storeBase, storeBase+24h), priorities 0-3, with the cascade watermark
// where a scheduler with a one-minute horizon from storeBase leaves it.
// Shared with the scheduler benchmarks.
func prefilledCopy(b *testing.B, layout storeLayout, pending int) string {
	b.Helper()
	src := prefilledStoreFile(b, layout, pending)
	dst := filepath.Join(b.TempDir(), "store.db")
	if err := copyStoreFile(dst, src); err != nil {
		b.Fatal(err)
	}
	return dst
}

// storePrefillMu serialises building the cache within one process.
var storePrefillMu sync.Mutex

// prefilledStoreFile returns the cached file, building it on first use.
func prefilledStoreFile(b *testing.B, layout storeLayout, pending int) string {
	b.Helper()
	storePrefillMu.Lock()
	defer storePrefillMu.Unlock()
	dir := os.Getenv("DELAYPROXY_BENCH_CACHE")
	if dir == "" {
		dir = "testdata" // bench/testdata is gitignored
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	// v5: bump when the store's layout, its defaults or this prefill change.
	path := filepath.Join(dir, fmt.Sprintf("store-v5-%s-pending%d-body%d-spread%d.db", layout.name, pending, storeBodyLen, storeSpread))
	if _, err := os.Stat(path); err == nil {
		return path
	}
	start := time.Now()
	// Another process may be building the same file: build under a name of
	// our own and rename, so neither sees a half-built file.
	tmp := fmt.Sprintf("%s.building-%d", path, os.Getpid())
	defer os.Remove(tmp)
	opts := layout.opts
	opts.NoSync = true
	s, err := boltstore.Open(tmp, opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	bench := &store.ExchangeDef{VHost: "/", Name: "bench", DelayedType: "direct", Durable: true}
	if err := s.PutExchange(ctx, bench); err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(42, uint64(pending)))
	body := make([]byte, storeBodyLen)
	const batch = 20_000
	for done := 0; done < pending; {
		msgs := make([]*store.Message, min(batch, pending-done))
		for i := range msgs {
			delay := r.Int64N(storeSpread)
			msgs[i] = &store.Message{VHost: "/", Exchange: "bench", RoutingKey: "rk", Body: body,
				Due: storeBase + delay, Delay: max(delay, 1), Priority: uint8(r.IntN(4)), Incarnation: bench.Incarnation}
		}
		if err := s.Put(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
		done += len(msgs)
	}
	// A running scheduler has loaded the next minute.
	if err := s.ScanKeys(0, storeBase+storeHorizon, func(store.Key) error { return nil }); err != nil {
		b.Fatal(err)
	}
	if got := s.Pending(); got != int64(pending) {
		b.Fatalf("prefilled store holds %d, want %d", got, pending)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		b.Fatal(err)
	}
	st, _ := os.Stat(path)
	b.Logf("built %s: %d MB in %v", path, st.Size()>>20, time.Since(start).Round(time.Second))
	return path
}

func copyStoreFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	// Write the copy back now, not during the measurement: background
	// writeback of a GB of dirty pages would slow every fsync measured.
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
