package amqpproxy

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// client091 replays confirms exactly as amqp091-go's confirms.One and
// confirms.Multiple do, recording what its listener would be told.
type client091 struct {
	expecting uint64
	published uint64
	sequencer map[uint64]bool
	notified  map[uint64]bool // tag -> ack
	dup       []uint64        // tags notified twice
}

func newClient091() *client091 {
	return &client091{expecting: 1, sequencer: map[uint64]bool{}, notified: map[uint64]bool{}}
}

func (c *client091) confirm(ack bool) {
	delete(c.sequencer, c.expecting)
	if _, ok := c.notified[c.expecting]; ok {
		c.dup = append(c.dup, c.expecting)
	}
	c.notified[c.expecting] = ack
	c.expecting++
}

func (c *client091) resequence() {
	for c.expecting <= c.published {
		ack, ok := c.sequencer[c.expecting]
		if !ok {
			return
		}
		c.confirm(ack)
	}
}

func (c *client091) frame(tag uint64, multiple, ack bool) {
	if multiple {
		for c.expecting <= tag {
			c.confirm(ack)
		}
	} else if c.expecting == tag {
		c.confirm(ack)
	} else {
		c.sequencer[tag] = ack
	}
	c.resequence()
}

// strictClient checks the protocol rule itself: a multiple frame may only
// cover tags whose fate is decided and of its kind; no tag is confirmed
// twice.
type strictClient struct {
	t         *testing.T
	truth     map[uint64]bool // decided tags -> ack
	confirmed map[uint64]bool
}

func (s *strictClient) frame(tag uint64, multiple, ack bool) {
	s.t.Helper()
	check := func(t uint64) {
		want, decided := s.truth[t]
		switch {
		case !decided:
			s.t.Fatalf("frame (tag %d, multiple %v) confirms tag %d which is still pending", tag, multiple, t)
		case want != ack:
			s.t.Fatalf("frame (tag %d, multiple %v, ack %v) confirms tag %d whose outcome is ack=%v", tag, multiple, ack, t, want)
		}
		s.confirmed[t] = true
	}
	if !multiple {
		if s.confirmed[tag] {
			s.t.Fatalf("tag %d confirmed twice", tag)
		}
		check(tag)
		return
	}
	n := 0
	for t := uint64(1); t <= tag; t++ {
		if !s.confirmed[t] {
			check(t)
			n++
		}
	}
	if n == 0 {
		s.t.Fatalf("multiple frame for tag %d confirms nothing", tag)
	}
}

// TestConfirmsModel drives confirms with random interleavings of relayed
// and locally answered publishes, upstream acks and nacks (single and
// multiple, in any order) and local answers, and checks the frames against
// the protocol and against amqp091-go's resequencing.
func TestConfirmsModel(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := newConfirms()
		truth := map[uint64]bool{}
		strict := &strictClient{t: t, truth: truth, confirmed: map[uint64]bool{}}
		amqp := newClient091()
		var upOut []uint64 // outstanding upstream tags, ascending
		upClient := map[uint64]uint64{}
		var localOut []uint64
		var lastUp uint64
		frames, multiples := 0, 0
		emit := func(ack bool) func(uint64, bool) {
			return func(tag uint64, multiple bool) {
				frames++
				if multiple {
					multiples++
				}
				strict.frame(tag, multiple, ack)
				amqp.frame(tag, multiple, ack)
			}
		}
		upConfirm := func() {
			ack := rng.IntN(5) != 0
			i := rng.IntN(len(upOut))
			u := upOut[i]
			multiple := rng.IntN(2) == 0
			var covered []uint64
			if multiple {
				covered = upOut[:i+1]
			} else {
				covered = []uint64{u}
			}
			for _, x := range covered {
				truth[upClient[x]] = ack
			}
			tags := c.fromUpstream(nil, u, multiple)
			if len(tags) != len(covered) {
				t.Fatalf("seed %d: upstream tag %d multiple=%v covers %d client tags, want %d", seed, u, multiple, len(tags), len(covered))
			}
			c.mark(tags, emit(ack))
			if multiple {
				upOut = slices.Delete(upOut, 0, i+1)
			} else {
				upOut = slices.Delete(upOut, i, i+1)
			}
		}
		localConfirm := func() {
			i := rng.IntN(len(localOut))
			ct := localOut[i]
			ack := rng.IntN(3) != 0
			truth[ct] = ack
			c.mark([]uint64{ct}, emit(ack))
			localOut = slices.Delete(localOut, i, i+1)
		}
		for range 400 {
			switch r := rng.IntN(10); {
			case r < 4:
				ct := c.publish()
				c.relay(ct)
				lastUp++
				upOut = append(upOut, lastUp)
				upClient[lastUp] = ct
				amqp.published++
			case r < 6:
				localOut = append(localOut, c.publish())
				amqp.published++
			case r < 8 && len(upOut) > 0:
				upConfirm()
			case len(localOut) > 0:
				localConfirm()
			}
			if got := c.fromUpstream(nil, lastUp+1, true); len(got) != 0 {
				t.Fatalf("seed %d: unknown upstream tag confirmed %v", seed, got)
			}
		}
		for len(upOut) > 0 || len(localOut) > 0 {
			if len(upOut) > 0 && (len(localOut) == 0 || rng.IntN(2) == 0) {
				upConfirm()
			} else {
				localConfirm()
			}
		}
		if len(amqp.dup) > 0 {
			t.Fatalf("seed %d: amqp091-go would notify tags %v twice", seed, amqp.dup)
		}
		for tag := uint64(1); tag <= amqp.published; tag++ {
			got, ok := amqp.notified[tag]
			if !ok {
				t.Fatalf("seed %d: tag %d never confirmed", seed, tag)
			}
			if got != truth[tag] {
				t.Fatalf("seed %d: amqp091-go would see tag %d as ack=%v, want %v", seed, tag, got, truth[tag])
			}
		}
		if c.done.len() != 0 || c.relayed.len() != 0 {
			t.Fatalf("seed %d: state left behind: %d client, %d upstream", seed, c.done.len(), c.relayed.len())
		}
		if seed == 0 {
			t.Logf("seed 0: %d publishes, %d frames, %d multiple", amqp.published, frames, multiples)
		}
	}
}

func TestConfirmsMark(t *testing.T) {
	type frame struct {
		tag      uint64
		multiple bool
	}
	tests := []struct {
		name    string
		publish int      // client tags 1..publish, all relayed in order
		before  []uint64 // confirmed earlier, one by one
		mark    []uint64
		want    []frame
	}{
		{"run from the lowest pending", 5, nil, []uint64{1, 2, 3}, []frame{{3, true}}},
		{"single", 5, nil, []uint64{1}, []frame{{1, false}}},
		{"gap is pending", 5, nil, []uint64{1, 2, 4}, []frame{{2, true}, {4, false}}},
		{"nothing from the lowest", 5, nil, []uint64{2, 3}, []frame{{2, false}, {3, false}}},
		{"run after earlier singles", 5, []uint64{3}, []uint64{1, 2}, []frame{{2, true}}},
		{"does not span an earlier single", 5, []uint64{2}, []uint64{1, 3, 4}, []frame{{1, false}, {3, false}, {4, false}}},
		{"already confirmed skipped", 3, []uint64{1}, []uint64{1, 2}, []frame{{2, false}}},
		{"duplicates once", 3, nil, []uint64{1, 1, 2}, []frame{{2, true}}},
		{"unsorted", 4, nil, []uint64{3, 1, 2}, []frame{{3, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newConfirms()
			for range tt.publish {
				c.publish()
			}
			for _, b := range tt.before {
				c.mark([]uint64{b}, func(uint64, bool) {})
			}
			var got []frame
			c.mark(slices.Clone(tt.mark), func(tag uint64, m bool) { got = append(got, frame{tag, m}) })
			if !slices.Equal(got, tt.want) {
				t.Fatalf("frames %v, want %v", got, tt.want)
			}
		})
	}
}

func TestConfirmsFromUpstream(t *testing.T) {
	c := newConfirms()
	// client tags 1..6; 3 and 5 answered locally; upstream tags 1..4.
	for ct := uint64(1); ct <= 6; ct++ {
		c.publish()
		if ct != 3 && ct != 5 {
			c.relay(ct)
		}
	}
	if got := c.fromUpstream(nil, 3, false); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("upstream 3 -> %v, want [4]", got)
	}
	if got := c.fromUpstream(nil, 3, false); len(got) != 0 {
		t.Fatalf("upstream 3 again -> %v, want nothing", got)
	}
	if got := c.fromUpstream(nil, 4, true); !slices.Equal(got, []uint64{1, 2, 6}) {
		t.Fatalf("upstream 4 multiple -> %v, want [1 2 6]", got)
	}
	if got := c.fromUpstream(nil, 9, true); len(got) != 0 {
		t.Fatalf("unknown upstream tag -> %v", got)
	}
	if c.relayed.len() != 0 || c.upBase != 5 {
		t.Fatalf("relayed %d, upBase %d", c.relayed.len(), c.upBase)
	}
}

func TestDequeFIFOAndCompaction(t *testing.T) {
	var d deque[int]
	next := 0
	for i := range 20000 {
		d.push(i)
		if i%4 != 0 { // pop three of every four: the queue grows slowly
			if got := d.popFront(); got != next {
				t.Fatalf("popped %d, want %d", got, next)
			}
			next++
		}
		if d.len() > 0 && *d.at(0) != next {
			t.Fatalf("front %d, want %d", *d.at(0), next)
		}
	}
	if d.len() != 5000 {
		t.Fatalf("len %d", d.len())
	}
	if len(d.buf) > 3*d.len() {
		t.Fatalf("deque holds %d slots for %d elements", len(d.buf), d.len())
	}
}
