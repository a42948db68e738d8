package boltstore

import (
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

const (
	// schemaVersion 2 added the released bucket, 3 the tally, 4 put the
	// epoch first in ids keys, 5 the journal, 6 the ids-gone bucket; Open
	// upgrades an older file.
	schemaVersion = 6
	storeMagic    = "delayproxy store"

	// maxDue bounds due times (year ~146 million) so that watermark
	// arithmetic never overflows.
	maxDue = int64(1) << 62
)

// The file's top-level buckets:
//
//	slots      slot index (due / SlotWidth, 8 B BE) -> nested bucket:
//	               stored key (17 B) -> encoded message   messages due before W
//	far        far index (due / FarWidth, 8 B BE) -> nested bucket:
//	               stored key (17 B) -> encoded message   messages due at or after W
//	released   slot index (8 B BE) -> nested bucket:
//	               Key (17 B) -> 0x01                     released messages of that slot
//	ids        epoch (Key's sequence >> 10, 8 B BE),
//	           uvarint len, vhost, uvarint len, exchange,
//	           uvarint len, message-id, Key -> (empty)    messages with a message-id: pending, or in ids-gone
//	ids-gone   counter (8 B BE) -> ids key                ids entries of messages taken out, to delete (idsgone.go)
//	exchanges  uvarint len, vhost, name -> encoded ExchangeDef
//	meta       magic, version, slot-ms, far-ms, seq (next sequence),
//	           incarnation (last one handed out), watermark W (ms),
//	           journal: id (8 B BE) | generation of the records not yet
//	           in bbolt (8 B BE) (journal.go),
//	           counts: nested bucket incarnation (8 B BE) -> stored messages (8 B BE)
//	           tally:  nested bucket hour (8 B BE) -> 60 uvarint counts (tally.go)
//
// A message is stored under its Key reordered sequence first (storedKey),
// so that every bucket is appended to in publish order:
//
//	 0              8              16     17
//	+--------------+--------------+------+
//	| sequence BE  | due ms BE    | 255- |
//	|              |              | prio |
//	+--------------+--------------+------+
//
// A far bucket is deleted once W passes its end; until then its entries
// below W are copies of messages already in slots, which every reader
// ignores. A message in a far bucket (cancelled before its cascade) is
// deleted in place.
var (
	bucketMeta      = []byte("meta")
	bucketCounts    = []byte("counts") // nested in meta
	bucketTally     = []byte("tally")  // nested in meta
	bucketSlots     = []byte("slots")
	bucketFar       = []byte("far")
	bucketIDs       = []byte("ids")
	bucketExchanges = []byte("exchanges")
	bucketReleased  = []byte("released")
	bucketIDsGone   = []byte("ids-gone")

	metaMagic       = []byte("magic")
	metaVersion     = []byte("version")
	metaSlotWidth   = []byte("slot-ms")
	metaFarWidth    = []byte("far-ms")
	metaSeq         = []byte("seq")
	metaIncarnation = []byte("incarnation")
	metaWatermark   = []byte("watermark")
	metaJournal     = []byte("journal")
)

func metaU64(b *bolt.Bucket, k []byte) (uint64, bool) {
	v := b.Get(k)
	if len(v) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

// slotKey is the key of a slot bucket: due / slot width, 8 B BE.
func (s *Store) slotKey(due int64) []byte { return u64(uint64(due / s.slotMs)) }

// farBucketKey is the key of a far bucket: due / far width, 8 B BE.
func (s *Store) farBucketKey(due int64) []byte { return u64(uint64(due / s.farMs)) }

// roundUp rounds t up to a slot boundary; t is capped at maxDue first, so
// the result never overflows and stays a slot boundary.
func (s *Store) roundUp(t int64) int64 {
	t = min(t, maxDue)
	return (t + s.slotMs - 1) / s.slotMs * s.slotMs
}

// readWatermark reads the watermark of tx's snapshot.
func readWatermark(tx *bolt.Tx) int64 {
	v, _ := metaU64(tx.Bucket(bucketMeta), metaWatermark)
	return int64(v)
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// journalMeta encodes meta's journal value.
func journalMeta(id, gen uint64) []byte {
	return binary.BigEndian.AppendUint64(u64(id), gen)
}
