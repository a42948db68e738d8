package delayproxy

import (
	"context"
	"slices"
	"testing"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// cancelLog records the keys the engine takes out of the wheel.
type cancelLog struct{ keys []store.Key }

func (c *cancelLog) Cancelled(keys ...store.Key) { c.keys = append(c.keys, keys...) }

func TestEngineCancelsReachTheScheduler(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		cancel func(e engine, msgs []*store.Message) error
		want   func(msgs []*store.Message) []store.Key
	}{
		{"by message-id", func(e engine, _ []*store.Message) error {
			_, err := e.Cancel(ctx, "/", "dx", "m-1")
			return err
		}, func(msgs []*store.Message) []store.Key { return []store.Key{msgs[1].Key, msgs[2].Key} }},
		{"by key", func(e engine, msgs []*store.Message) error {
			_, err := e.CancelKey(ctx, msgs[0].Key)
			return err
		}, func(msgs []*store.Message) []store.Key { return []store.Key{msgs[0].Key} }},
		{"by key, not pending", func(e engine, msgs []*store.Message) error {
			k := msgs[0].Key
			k[16]++ // no such sequence
			_, err := e.CancelKey(ctx, k)
			return err
		}, func([]*store.Message) []store.Key { return nil }},
		{"no match", func(e engine, _ []*store.Message) error {
			_, err := e.Cancel(ctx, "/", "dx", "nobody")
			return err
		}, func([]*store.Message) []store.Key { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := teststore.Open(t, "", boltstore.Options{NoSync: true})
			storetest.Exchange(t, st, "/", "dx")
			msgs := []*store.Message{
				storetest.Message("dx", storetest.Base, 0, "a"),
				storetest.Message("dx", storetest.Base+1, 0, "b"),
				storetest.Message("dx", storetest.Base+2, 0, "c"),
			}
			msgs[0].MessageID, msgs[1].MessageID, msgs[2].MessageID = "m-0", "m-1", "m-1"
			storetest.Put(t, st, msgs...)
			log := &cancelLog{}
			if err := tt.cancel(engine{Store: st, sched: log}, msgs); err != nil {
				t.Fatal(err)
			}
			got, want := log.keys, tt.want(msgs)
			slices.SortFunc(got, store.CompareKeys)
			if !slices.Equal(got, want) {
				t.Errorf("keys taken out of the wheel = %x, want %x", got, want)
			}
		})
	}
}
