package boltstore

import (
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// TestCheckFindsDamage: Check reports a mark without its message, a slot
// left holding only released messages, and a tally that does not count the
// messages stored.
func TestCheckFindsDamage(t *testing.T) {
	for _, tc := range []struct {
		name string
		harm func(tx *bolt.Tx, idx []byte, k store.Key) error
		want string
	}{
		{"mark without a message", func(tx *bolt.Tx, idx []byte, k store.Key) error {
			rb, err := tx.Bucket(bucketReleased).CreateBucketIfNotExists(idx)
			if err != nil {
				return err
			}
			other := store.MakeKey(k.Due(), 0, 999999)
			return rb.Put(other[:], releasedMark)
		}, "is not in its slot"},
		{"slot of released messages only", func(tx *bolt.Tx, idx []byte, k store.Key) error {
			rb, err := tx.Bucket(bucketReleased).CreateBucketIfNotExists(idx)
			if err != nil {
				return err
			}
			return rb.Put(k[:], releasedMark) // counts still say pending
		}, "holds no unreleased message"},
		{"tally off by one", func(tx *bolt.Tx, _ []byte, k store.Key) error {
			var row tallyRow
			row[k.Due()%tallyHour/tallyMinute] = 2
			return tx.Bucket(bucketMeta).Bucket(bucketTally).Put(u64(uint64(k.Due()/tallyHour)), row.encode())
		}, "tally: 1 hours counted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, k := fileWithMessage(t, base-5000, base)
			tamper(t, path, func(tx *bolt.Tx) error { return tc.harm(tx, u64(uint64(k.Due()/1000)), k) })
			s, err := Open(path, Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
