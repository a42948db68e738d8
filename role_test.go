package delayproxy

import (
	"context"
	"slices"
	"testing"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// confirmAll is a releaser that confirms every message and records what
// it was handed.
type confirmAll struct{ got []*store.Message }

func (c *confirmAll) Release(_ context.Context, batch []*store.Message) []bool {
	c.got = append(c.got, batch...)
	confirmed := make([]bool, len(batch))
	for i := range confirmed {
		confirmed[i] = true
	}
	return confirmed
}

func (c *confirmAll) Publish(ctx context.Context, batch []*store.Message) (func() []bool, bool) {
	confirmed := c.Release(ctx, batch)
	return func() []bool { return confirmed }, false
}

// TestFencedReleaserByPartition: a message is published only while its
// partition's role is held and its term lasts; the others are
// unconfirmed, unpublished, in their places in the batch.
func TestFencedReleaserByPartition(t *testing.T) {
	// Incarnations 1..10: partitions 1..7, 0, 1, 2.
	var batch []*store.Message
	for inc := uint64(1); inc <= 10; inc++ {
		batch = append(batch, &store.Message{Incarnation: inc})
	}
	every := []int{0, 1, 2, 3, 4, 5, 6, 7}
	tests := []struct {
		name  string
		held  []int
		ended bool // the term's ctx ended
		want  []bool
	}{
		{"every partition", every, false, []bool{true, true, true, true, true, true, true, true, true, true}},
		{"none", nil, false, make([]bool, 10)},
		{"partitions 1 and 0", []int{0, 1}, false, []bool{true, false, false, false, false, false, false, true, true, false}},
		{"every partition, term ended", every, true, make([]bool, 10)},
		{"partitions 1 and 0, term ended", []int{0, 1}, true, make([]bool, 10)},
	}
	for _, tt := range tests {
		for _, pipelined := range []bool{false, true} {
			r := &confirmAll{}
			f := fencedReleaser{r: r, held: func(p int) bool { return slices.Contains(tt.held, p) }}
			ctx, cancel := context.WithCancel(context.Background())
			if tt.ended {
				cancel()
			}
			var got []bool
			if pipelined {
				wait, refused := f.Publish(ctx, batch)
				if want := slices.Contains(tt.want, false); refused != want {
					t.Errorf("%s: refused %v, want %v", tt.name, refused, want)
				}
				got = wait()
			} else {
				got = f.Release(ctx, batch)
			}
			cancel()
			if tt.ended && len(r.got) > 0 {
				t.Errorf("%s: published %d messages after the term ended", tt.name, len(r.got))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("%s (pipelined %v): confirmed %v, want %v", tt.name, pipelined, got, tt.want)
			}
			for _, m := range r.got {
				if !slices.Contains(tt.held, pgstore.PartitionOf(m.Incarnation)) {
					t.Errorf("%s: published a message of partition %d", tt.name, pgstore.PartitionOf(m.Incarnation))
				}
			}
		}
	}
}
