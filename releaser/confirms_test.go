package releaser

import (
	"reflect"
	"testing"
	"time"
)

func TestConfirms(t *testing.T) {
	type confirm struct {
		tag      uint64
		multiple bool
		st       confirmState
	}
	// Three batches: tags 1-3, 4-5 and 6-9.
	sizes := []int{3, 2, 4}
	tests := []struct {
		name     string
		confirms []confirm
		end      bool
		want     [][]bool // confirmed, per batch
		done     []bool   // whether each batch is done
	}{
		{"one multiple ack for all", []confirm{{9, true, acked}}, false,
			[][]bool{{true, true, true}, {true, true}, {true, true, true, true}}, []bool{true, true, true}},
		{"single acks out of order", []confirm{{5, false, acked}, {4, false, acked}, {2, false, acked}}, false,
			[][]bool{{false, true, false}, {true, true}, {false, false, false, false}}, []bool{false, true, false}},
		{"a multiple ack into a batch", []confirm{{2, false, acked}, {7, true, acked}}, false,
			[][]bool{{true, true, true}, {true, true}, {true, true, false, false}}, []bool{true, true, false}},
		{"nacks are not confirmed", []confirm{{3, true, nacked}, {4, false, acked}, {5, false, nacked}}, false,
			[][]bool{{false, false, false}, {true, false}, {false, false, false, false}}, []bool{true, true, false}},
		{"a tag settled twice keeps the first", []confirm{{1, false, acked}, {3, true, nacked}}, false,
			[][]bool{{true, false, false}, {false, false}, {false, false, false, false}}, []bool{true, false, false}},
		{"unknown tags are ignored", []confirm{{0, false, acked}, {10, false, acked}}, false,
			[][]bool{{false, false, false}, {false, false}, {false, false, false, false}}, []bool{false, false, false}},
		{"the end fails what is open", []confirm{{4, true, acked}}, true,
			[][]bool{{true, true, true}, {true, false}, {false, false, false, false}}, []bool{true, true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cs confirms
			var ps []*pending
			tag := uint64(1)
			for _, n := range sizes {
				idx := make([]int, n)
				for i := range idx {
					idx[i] = i
				}
				p, ok := cs.add(tag, idx)
				if !ok {
					t.Fatal("add refused")
				}
				ps = append(ps, p)
				tag += uint64(n)
			}
			for _, c := range tt.confirms {
				cs.settle(c.tag, c.multiple, c.st)
			}
			if tt.end {
				if lost := cs.end(); !lost {
					t.Error("end reported nothing lost")
				}
				if _, ok := cs.add(tag, []int{0}); ok {
					t.Error("add after end accepted")
				}
			}
			for b, p := range ps {
				select {
				case <-p.done:
					if !tt.done[b] {
						t.Errorf("batch %d done", b)
					}
				default:
					if tt.done[b] {
						t.Errorf("batch %d not done", b)
					}
				}
				got := make([]bool, len(p.idx))
				cs.await(p, time.Millisecond, got)
				if !reflect.DeepEqual(got, tt.want[b]) {
					t.Errorf("batch %d confirmed %v, want %v", b, got, tt.want[b])
				}
			}
			if !tt.end {
				var open int
				for _, d := range tt.done {
					if !d {
						open++
					}
				}
				if len(cs.open) != open {
					t.Errorf("%d batches open, want %d", len(cs.open), open)
				}
			}
		})
	}
}
