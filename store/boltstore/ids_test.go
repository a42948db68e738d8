package boltstore

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// TestCancelByIDAcrossEpochs: the ids index is sorted by epoch first, so a
// message-id whose messages were stored thousands of sequence numbers
// apart sits in several epochs; Cancel finds it in each, and not under
// another exchange or a longer id that shares its prefix.
func TestCancelByIDAcrossEpochs(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	h.exchange("/", "y")
	var want []store.Key
	var others []*store.Message
	for round := range 4 {
		var msgs []*store.Message
		for i := range 1000 {
			m := msg("x", base+int64(i), 0, fmt.Sprint(round, "-", i))
			switch i {
			case 500:
				m.MessageID = "needle"
			case 501:
				m.MessageID = "needle2"
				others = append(others, m)
			case 502:
				m.Exchange, m.MessageID = "y", "needle"
				others = append(others, m)
			default:
				m.MessageID = fmt.Sprint("id-", round, "-", i)
			}
			msgs = append(msgs, m)
		}
		h.put(msgs...)
		want = append(want, msgs[500].Key)
	}
	if idEpoch(want[0]) == idEpoch(want[len(want)-1]) {
		t.Fatalf("test needs messages in several epochs: %d and %d", idEpoch(want[0]), idEpoch(want[len(want)-1]))
	}
	got, err := h.s.Cancel(context.Background(), "/", "x", "needle")
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Cancel: %x %v, want %x", got, err, want)
	}
	h.check()
	for _, m := range others {
		if got := h.s.Count(m.VHost, m.Exchange); got == 0 {
			t.Fatalf("exchange %s lost its messages", m.Exchange)
		}
		if ms, _ := h.s.Get([]store.Key{m.Key}); ms[0] == nil {
			t.Fatalf("message %q of %s cancelled with needle", m.MessageID, m.Exchange)
		}
	}
}
