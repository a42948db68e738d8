package scheduler

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

const t0 = int64(1_700_000_000_000) // a unix ms to start wheels at

func key(due int64, prio uint8, seq uint64) store.Key { return store.MakeKey(due, prio, seq) }

func TestNewWheelSpan(t *testing.T) {
	tests := []struct {
		ask, want int64
	}{
		{0, 128}, {1, 128}, {64, 128}, {65, 256}, {60_000, 65536}, {65_472, 65536}, {65_473, 131072},
	}
	for _, tc := range tests {
		w := NewWheel(t0, tc.ask)
		if w.Span() != tc.want {
			t.Errorf("NewWheel(_, %d).Span() = %d, want %d", tc.ask, w.Span(), tc.want)
		}
		// t0 is a multiple of 64: the horizon ends one bucket short of the span.
		if w.Horizon() != t0+tc.want-1 || w.Horizon() < t0+tc.ask || w.Now() != t0 || w.Len() != 0 {
			t.Errorf("NewWheel(_, %d): Horizon %+d Now %+d Len %d", tc.ask, w.Horizon()-t0, w.Now()-t0, w.Len())
		}
	}
	// Mid-bucket, the horizon stays clear of the current bucket's slots.
	w := NewWheel(t0+10, 64)
	if h := w.Horizon(); h != t0+127 {
		t.Errorf("Horizon at +10 = %+d, want +127", h-t0)
	}
	w.Expire(t0+63, nil)
	if h := w.Horizon(); h != t0+191 {
		t.Errorf("Horizon at +63 = %+d, want +191", h-t0)
	}
}

func TestWheelExpireOrder(t *testing.T) {
	tests := []struct {
		name string
		add  []store.Key
		now  int64
		want []store.Key // in this order; the rest stays
	}{
		{
			name: "by due",
			add:  []store.Key{key(t0+30, 0, 3), key(t0+10, 0, 1), key(t0+20, 0, 2)},
			now:  t0 + 30,
			want: []store.Key{key(t0+10, 0, 1), key(t0+20, 0, 2), key(t0+30, 0, 3)},
		},
		{
			name: "by priority, then due, across due times",
			add:  []store.Key{key(t0+1, 1, 1), key(t0+2, 9, 2), key(t0+3, 5, 3), key(t0+4, 9, 4), key(t0+5, 0, 5)},
			now:  t0 + 4,
			want: []store.Key{key(t0+2, 9, 2), key(t0+4, 9, 4), key(t0+3, 5, 3), key(t0+1, 1, 1)},
		},
		{
			name: "priority descending within a due time",
			add:  []store.Key{key(t0+5, 0, 1), key(t0+5, 9, 2), key(t0+5, 3, 3), key(t0+5, 255, 4)},
			now:  t0 + 5,
			want: []store.Key{key(t0+5, 255, 4), key(t0+5, 9, 2), key(t0+5, 3, 3), key(t0+5, 0, 1)},
		},
		{
			name: "publish order within a priority",
			add:  []store.Key{key(t0+5, 1, 7), key(t0+5, 1, 2), key(t0+5, 1, 5)},
			now:  t0 + 5,
			want: []store.Key{key(t0+5, 1, 2), key(t0+5, 1, 5), key(t0+5, 1, 7)},
		},
		{
			name: "never early",
			add:  []store.Key{key(t0+5, 0, 1), key(t0+6, 9, 2)},
			now:  t0 + 5,
			want: []store.Key{key(t0+5, 0, 1)},
		},
		{
			name: "nothing due",
			add:  []store.Key{key(t0+1, 0, 1)},
			now:  t0,
			want: nil,
		},
		{
			name: "overdue on add, by priority",
			add:  []store.Key{key(t0+1, 0, 5), key(t0-100, 0, 9), key(t0, 1, 8)},
			now:  t0 + 1,
			want: []store.Key{key(t0, 1, 8), key(t0-100, 0, 9), key(t0+1, 0, 5)},
		},
		{
			name: "the last slot of the span",
			add:  []store.Key{key(t0+64, 0, 1), key(t0+1, 0, 2)},
			now:  t0 + 100,
			want: []store.Key{key(t0+1, 0, 2), key(t0+64, 0, 1)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWheel(t0, 64)
			for _, k := range tc.add {
				if !w.Add(k) {
					t.Fatalf("Add(%v) = false", k.Due()-t0)
				}
			}
			got := w.Expire(tc.now, nil)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Expire = %v, want %v", dues(got), dues(tc.want))
			}
			if w.Len() != len(tc.add)-len(tc.want) {
				t.Fatalf("Len = %d after expiring %d of %d", w.Len(), len(tc.want), len(tc.add))
			}
		})
	}
}

func dues(ks []store.Key) []int64 {
	var out []int64
	for _, k := range ks {
		out = append(out, k.Due()-t0)
	}
	return out
}

func TestWheelAddRejects(t *testing.T) {
	w := NewWheel(t0, 64)
	tests := []struct {
		name string
		k    store.Key
		want bool
	}{
		{"in span", key(t0+1, 0, 1), true},
		{"duplicate", key(t0+1, 0, 1), false},
		{"at horizon", key(t0+127, 0, 2), true},
		{"after horizon", key(t0+128, 0, 3), false},
		{"overdue", key(t0-5, 0, 4), true},
		{"overdue duplicate", key(t0-5, 0, 4), false},
		{"same due, other priority", key(t0+1, 1, 1), true},
	}
	for _, tc := range tests {
		if got := w.Add(tc.k); got != tc.want {
			t.Errorf("%s: Add = %v, want %v", tc.name, got, tc.want)
		}
	}
	if w.Len() != 4 {
		t.Fatalf("Len = %d, want 4", w.Len())
	}
}

func TestWheelCancel(t *testing.T) {
	w := NewWheel(t0, 64)
	a, b, c, d := key(t0+3, 0, 1), key(t0+3, 5, 2), key(t0+40, 0, 3), key(t0-1, 0, 4)
	for _, k := range []store.Key{a, b, c, d} {
		w.Add(k)
	}
	tests := []struct {
		k    store.Key
		want bool
	}{
		{b, true}, {b, false}, {c, true}, {d, true}, {d, false}, {key(t0+999, 0, 1), false}, {key(t0+3, 0, 9), false},
	}
	for _, tc := range tests {
		if got := w.Cancel(tc.k); got != tc.want {
			t.Errorf("Cancel(due %d) = %v, want %v", tc.k.Due()-t0, got, tc.want)
		}
	}
	if got := w.Expire(t0+100, nil); !slices.Equal(got, []store.Key{a}) {
		t.Fatalf("Expire after cancels = %v, want only due 3", dues(got))
	}
	if next, ok := w.Next(); ok {
		t.Fatalf("Next = %d on an empty wheel", next)
	}
}

func TestWheelNext(t *testing.T) {
	w := NewWheel(t0, 4096*3) // several summary words
	if _, ok := w.Next(); ok {
		t.Fatal("Next on empty wheel reported an entry")
	}
	for _, due := range []int64{t0 + 9000, t0 + 5000, t0 + 16000} {
		w.Add(key(due, 0, 1))
	}
	steps := []struct {
		now      int64
		released int
		next     int64
	}{
		{t0 + 100, 0, t0 + 5000},
		{t0 + 5000, 1, t0 + 9000},
		{t0 + 8999, 0, t0 + 9000},
		{t0 + 12000, 1, t0 + 16000},
	}
	for _, s := range steps {
		if got := len(w.Expire(s.now, nil)); got != s.released {
			t.Fatalf("Expire(%d) released %d, want %d", s.now-t0, got, s.released)
		}
		if next, ok := w.Next(); !ok || next != s.next {
			t.Fatalf("after Expire(%d): Next = %d, %v; want %d", s.now-t0, next-t0, ok, s.next-t0)
		}
	}
	// Wrap around: an entry whose slot index is below the position's.
	w.Add(key(t0+12000+16000, 0, 2))
	w.Expire(t0+16000, nil)
	if next, _ := w.Next(); next != t0+28000 {
		t.Fatalf("Next after wrap = %d, want 28000", next-t0)
	}
}

func TestWheelExpireN(t *testing.T) {
	w := NewWheel(t0, 64)
	var all []store.Key
	for i := range 10 {
		k := key(t0+int64(i/3)+1, uint8(i%3), uint64(i))
		all = append(all, k)
		w.Add(k)
	}
	slices.SortFunc(all, releaseOrder)
	var got []store.Key
	for len(got) < len(all) {
		before := len(got)
		got = w.ExpireN(t0+10, got, 2)
		if len(got)-before != 2 && len(got) != len(all) {
			t.Fatalf("ExpireN(max 2) returned %d", len(got)-before)
		}
		// A key added behind those taken keeps its place among the rest.
		if before == 0 {
			late := key(t0+1, 0, 50)
			w.Add(late)
			all = append(all, late)
			slices.SortFunc(all[2:], releaseOrder)
		}
	}
	if !slices.Equal(got, all) {
		t.Fatalf("ExpireN in steps = %v, want %v", got, all)
	}
}

func TestWheelClockBack(t *testing.T) {
	w := NewWheel(t0, 64)
	w.Expire(t0+50, nil)
	// The wall clock went back 40 ms: a key due in between must wait for it.
	w.Add(key(t0+20, 0, 1))
	w.Add(key(t0+45, 0, 2))
	if got := w.Expire(t0+10, nil); len(got) != 0 {
		t.Fatalf("Expire(10) after the clock went back released %v", dues(got))
	}
	if w.Now() != t0+50 {
		t.Fatalf("Now moved back to %d", w.Now()-t0)
	}
	if next, _ := w.Next(); next != t0+20 {
		t.Fatalf("Next = %d, want 20", next-t0)
	}
	if got := w.Expire(t0+20, nil); !slices.Equal(got, []store.Key{key(t0+20, 0, 1)}) {
		t.Fatalf("Expire(20) = %v", dues(got))
	}
}

// oracle is the wheel's specification: a set of keys sorted in key order,
// whose due entries expire in release order.
type oracle []store.Key

func (o *oracle) add(k store.Key) bool {
	j, found := slices.BinarySearchFunc(*o, k, store.CompareKeys)
	if found {
		return false
	}
	*o = slices.Insert(*o, j, k)
	return true
}

func (o *oracle) cancel(k store.Key) bool {
	j, found := slices.BinarySearchFunc(*o, k, store.CompareKeys)
	if found {
		*o = slices.Delete(*o, j, j+1)
	}
	return found
}

func (o *oracle) expire(now int64, max int) []store.Key {
	var out []store.Key // the first max due keys in release order
	for _, k := range *o {
		if k.Due() > now {
			continue
		}
		if j, _ := slices.BinarySearchFunc(out, k, releaseOrder); j < max {
			out = slices.Insert(out, j, k)
			out = out[:min(len(out), max)]
		}
	}
	taken := make(map[store.Key]bool, len(out))
	for _, k := range out {
		taken[k] = true
	}
	*o = slices.DeleteFunc(*o, func(k store.Key) bool { return taken[k] })
	return out
}

// checkAgainstOracle runs ops decoded from r against a wheel and the oracle.
func checkAgainstOracle(t *testing.T, span int64, next func() (op byte, a, b uint64), steps int) {
	t.Helper()
	w := NewWheel(t0, span)
	span = w.Span()
	var o oracle
	var held []store.Key // keys added, for cancels that hit
	clock := t0
	lastPos := w.Now()
	for i := 0; i < steps; i++ {
		op, a, b := next()
		switch op % 8 {
		case 0, 1, 2: // add, due spread around the wheel's window
			due := w.Now() - int64(span/4) + int64(a%uint64(span*3/2))
			k := key(due, uint8(b%4), b%64)
			want := due <= w.Horizon() && !slices.Contains(o, k)
			if want {
				o.add(k)
				held = append(held, k)
			}
			if got := w.Add(k); got != want {
				t.Fatalf("step %d: Add(due %+d) = %v, want %v", i, due-w.Now(), got, want)
			}
		case 3: // cancel something held or a miss
			var k store.Key
			if len(held) > 0 && a%4 != 0 {
				k = held[int(b%uint64(len(held)))]
			} else {
				k = key(w.Now()+int64(a%uint64(span)), uint8(b%4), b%64)
			}
			want := o.cancel(k)
			if got := w.Cancel(k); got != want {
				t.Fatalf("step %d: Cancel = %v, want %v", i, got, want)
			}
		case 4, 5, 6: // time passes (sometimes a lot, sometimes backwards)
			switch a % 16 {
			case 0:
				clock += int64(span) * 2
			case 1:
				clock -= int64(b % uint64(span))
			default:
				clock += int64(a % 20)
			}
			max := int(b%32) + 1
			if a%3 == 0 {
				max = 1 << 30
			}
			want := o.expire(clock, max)
			got := w.ExpireN(clock, nil, max)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: ExpireN(%+d, %d) = %v, want %v", i, clock-t0, max, dues(got), dues(want))
			}
			for _, k := range got {
				if k.Due() > clock {
					t.Fatalf("step %d: early: due %d > now %d", i, k.Due(), clock)
				}
			}
			if w.Now() < lastPos {
				t.Fatalf("step %d: Now went back from %d to %d", i, lastPos, w.Now())
			}
			lastPos = w.Now()
		case 7:
			next, ok := w.Next()
			if ok != (len(o) > 0) || ok && next != o[0].Due() {
				t.Fatalf("step %d: Next = %d, %v; oracle has %d, first due %v", i, next, ok, len(o), dues(o[:min(len(o), 1)]))
			}
			last, ok := w.Last()
			if ok != (len(o) > 0) || ok && last != o[len(o)-1] {
				t.Fatalf("step %d: Last = %v, %v; oracle has %d", i, dues([]store.Key{last}), ok, len(o))
			}
			checkPeek(t, w, o, w.Now()-16+int64(a%uint64(span)), int64(b%uint64(span)))
		}
		if w.Len() != len(o) {
			t.Fatalf("step %d: Len = %d, oracle %d", i, w.Len(), len(o))
		}
	}
}

// checkPeek compares Peek and NextAfter over (after, after+length] with
// the oracle: the keys held due in that range and after Now(), in key
// order, up to the horizon.
func checkPeek(t *testing.T, w *Wheel, o oracle, after, length int64) {
	t.Helper()
	from, until := max(after, w.Now()), min(after+length, w.Horizon())
	var want []store.Key
	wantNext, wantOK := int64(0), false
	for _, k := range o {
		if k.Due() > from && !wantOK {
			wantNext, wantOK = k.Due(), true
		}
		if k.Due() > from && k.Due() <= until {
			want = append(want, k)
		}
	}
	if got := w.Peek(after, after+length, nil); !slices.Equal(got, want) {
		t.Fatalf("Peek(%+d, %+d) at %+d = %v, want %v", after-t0, after+length-t0, w.Now()-t0, dues(got), dues(want))
	}
	if got, ok := w.NextAfter(after); ok != wantOK || got != wantNext {
		t.Fatalf("NextAfter(%+d) at %+d = %+d, %v, want %+d, %v", after-t0, w.Now()-t0, got-t0, ok, wantNext-t0, wantOK)
	}
}

func TestWheelPeek(t *testing.T) {
	// Keys in the slots (due before the open bucket), staged in later
	// buckets, already due, and the slot table wrapping around.
	tests := []struct {
		name         string
		now          int64 // the wheel's position, after Expire
		add          []int64
		after, until int64
		want         []int64 // due times, relative to t0
		next         int64   // NextAfter(after), relative; 0 is none
	}{
		{name: "empty", after: 0, until: 100},
		{name: "slots and stages", add: []int64{5, 70, 64, 120, 100}, after: 4, until: 110, want: []int64{5, 64, 70, 100}, next: 5},
		{name: "after excludes", add: []int64{5, 6, 7}, after: 5, until: 7, want: []int64{6, 7}, next: 6},
		{name: "until bounds", add: []int64{5, 6, 120}, after: 0, until: 6, want: []int64{5, 6}, next: 5},
		{name: "none in range, one later", add: []int64{120}, after: 0, until: 100, next: 120},
		{name: "due keys left out", now: 50, add: []int64{10, 40, 51, 60}, after: 0, until: 60, want: []int64{51, 60}, next: 51},
		{name: "wrapped slot table", now: 100, add: []int64{101, 120, 129, 150, 190}, after: 125, until: 160, want: []int64{129, 150}, next: 129},
		{name: "keys before after stay out when the table wraps", now: 100, add: []int64{101, 105}, after: 110, until: 191, next: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWheel(t0, 64) // span 128: the horizon is +127 at 0, +191 at 100
			w.Expire(t0+tc.now, nil)
			for _, d := range tc.add {
				w.Add(key(t0+d, 0, uint64(d)))
			}
			var got []int64
			for _, k := range w.Peek(t0+tc.after, t0+tc.until, nil) {
				got = append(got, k.Due()-t0)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Peek = %v, want %v", got, tc.want)
			}
			next, ok := w.NextAfter(t0 + tc.after)
			if ok != (tc.next != 0) || ok && next-t0 != tc.next {
				t.Errorf("NextAfter = %+d, %v, want %+d", next-t0, ok, tc.next)
			}
			if n := len(w.Expire(t0+1000, nil)); n != len(tc.add) {
				t.Errorf("Expire after Peek returned %d keys, want every one of the %d added", n, len(tc.add))
			}
		})
	}
}

func TestWheelProperty(t *testing.T) {
	for seed := range uint64(20) {
		for _, span := range []int64{64, 8192} {
			r := rand.New(rand.NewPCG(seed, uint64(span)))
			checkAgainstOracle(t, span, func() (byte, uint64, uint64) {
				return byte(r.IntN(8)), r.Uint64(), r.Uint64()
			}, 3000)
		}
	}
}

func FuzzWheel(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})
	f.Add(make([]byte, 170))
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() (byte, uint64, uint64) {
			if len(data) < 17 {
				data = append(data, make([]byte, 17-len(data))...)
			}
			op, a, b := data[0], binary.LittleEndian.Uint64(data[1:9]), binary.LittleEndian.Uint64(data[9:17])
			data = data[17:]
			return op, a, b
		}
		checkAgainstOracle(t, 64+int64(len(data)%3)*4096, next, len(data)/17)
	})
}

func TestWheelLongBacklog(t *testing.T) {
	// A restart after downtime: many overdue keys drained in small batches
	// while more overdue keys arrive; order holds and memory is given back.
	w := NewWheel(t0, 64)
	var o oracle
	seq := uint64(0)
	addN := func(n int) {
		for range n {
			seq++
			k := key(t0-100_000+int64(seq), uint8(seq%3), seq)
			w.Add(k)
			o.add(k)
		}
	}
	addN(10_000)
	for w.Len() > 0 {
		want := o.expire(t0, 100)
		if got := w.ExpireN(t0, nil, 100); !slices.Equal(got, want) {
			t.Fatalf("ExpireN = %v, want %v", dues(got), dues(want))
		}
		if seq < 20_000 {
			addN(50)
		}
		for i, q := range w.due.q {
			if q.head > 1024 && q.head > 2*q.live {
				t.Fatalf("queue %d keeps %d free entries in front of %d live ones", i, q.head, q.live)
			}
		}
	}
	for i, q := range w.due.q {
		if cap(q.e) > 4096 {
			t.Fatalf("drained backlog: queue %d still holds a %d-entry array", i, cap(q.e))
		}
	}
}

func TestWheelBehindCancelAndRetry(t *testing.T) {
	// Behind a backlog, the due keys wait in one queue per priority:
	// cancels in the middle, a batch put back in front (a retry) and keys
	// added again after their cancel keep release order, and the queues
	// give their memory back.
	w := NewWheel(t0, 64)
	var o oracle
	k := func(i int) store.Key { return key(t0-10_000+int64(i), uint8(i%2), uint64(i)) }
	for i := range 5000 {
		w.Add(k(i))
		o.add(k(i))
	}
	expire := func(max int) []store.Key {
		t.Helper()
		want := o.expire(t0, max)
		got := w.ExpireN(t0, nil, max)
		if !slices.Equal(got, want) {
			t.Fatalf("ExpireN(%d) = %v, want %v", max, dues(got), dues(want))
		}
		return got
	}
	expire(100) // more is due than that: all of it goes into the queues
	if w.Add(k(4000)) {
		t.Fatal("Add of a due key held reported new")
	}
	for i := 1500; i < 3500; i += 2 {
		if got, want := w.Cancel(k(i)), o.cancel(k(i)); got != want {
			t.Fatalf("Cancel(%d) = %v, want %v", i, got, want)
		}
	}
	for i := 1500; i < 1600; i += 4 {
		if !w.Add(k(i)) {
			t.Fatalf("Add(%d) after its cancel = false", i)
		}
		o.add(k(i))
	}
	for _, k := range expire(256) { // not confirmed: back they go
		if !w.Add(k) {
			t.Fatalf("Add of a retried key = false")
		}
		o.add(k)
	}
	for w.Len() > 0 {
		expire(97)
		for i, q := range w.due.q {
			if dead := len(q.e) - q.head - q.live; dead >= 64 && dead > q.live {
				t.Fatalf("queue %d keeps %d cancelled entries beside %d live ones", i, dead, q.live)
			}
		}
		if w.Len() != len(o) {
			t.Fatalf("Len = %d, oracle %d", w.Len(), len(o))
		}
	}
	for i, q := range w.due.q {
		if cap(q.e) > 4096 {
			t.Fatalf("drained: queue %d still holds a %d-entry array", i, cap(q.e))
		}
	}
}
