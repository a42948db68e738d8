package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// Check verifies the file (bbolt's page check) and the store's own
// invariants: every message in the right slot or far bucket, no slot
// without an unreleased message, every released mark on a message of its
// slot, no far bucket left behind the watermark, the ids index matching the
// messages both ways, the counters and the tally in meta and in memory
// equal to what is stored, sequence and incarnation counters ahead of every
// stored value. It reads the whole file, between two commits: meant for
// tests and offline checks.
func (s *Store) Check() error {
	return s.do(context.Background(), &request{kind: opCheck})
}

// check runs in the writer goroutine, so memory and file agree.
func (s *Store) check() error {
	var errs []error
	add := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			add("bbolt: %v", err)
		}
		meta := tx.Bucket(bucketMeta)
		w := readWatermark(tx)
		seq, _ := metaU64(meta, metaSeq)
		incCounter, _ := metaU64(meta, metaIncarnation)
		if w != s.watermark || w%s.slotMs != 0 {
			add("watermark %d in file, %d in memory, slot width %d", w, s.watermark, s.slotMs)
		}
		if seq != s.persistedSeq || seq > s.nextSeq.Load() {
			add("sequence %d in file, %d persisted in memory, %d next", seq, s.persistedSeq, s.nextSeq.Load())
		}
		if incCounter != s.incCounter {
			add("incarnation counter %d in file, %d in memory", incCounter, s.incCounter)
		}
		ids := tx.Bucket(bucketIDs)
		gone := map[string]bool{} // ids keys in ids-gone
		next := s.goneFirst
		if err := tx.Bucket(bucketIDsGone).ForEach(func(k, v []byte) error {
			if len(k) != 8 || beUint64(k) != next {
				add("ids-gone key %x out of sequence (want %d)", k, next)
			}
			next++
			if gone[string(v)] || !has(ids, v) {
				add("ids-gone value %x is a duplicate or not in the ids index", v)
			}
			gone[string(v)] = true
			return nil
		}); err != nil {
			return err
		}
		if next != s.goneNext {
			add("ids-gone holds keys up to %d, %d in memory", next, s.goneNext)
		}
		counted := map[uint64]int64{}
		tallied := map[int64]*tallyRow{}
		withID := 0
		message := func(where string, k store.Key, v []byte) {
			mv, err := viewMessage(v)
			if err != nil {
				add("%s key %x: %v", where, k[:], err)
				return
			}
			counted[mv.incarnation]++
			countDue(tallied, k.Due())
			if k.Seq() >= seq {
				add("%s key %x: sequence %d not below next %d", where, k[:], k.Seq(), seq)
			}
			if mv.incarnation == 0 || mv.incarnation > incCounter {
				add("%s key %x: incarnation %d beyond counter %d", where, k[:], mv.incarnation, incCounter)
			}
			hasID := mv.flags&flagMessageID != 0
			if hasID != (len(mv.messageID) > 0) {
				add("%s key %x: message-id flag disagrees with message-id %q", where, k[:], mv.messageID)
			}
			if hasID {
				withID++
				if ik := idKey(mv.vhost, mv.exchange, mv.messageID, k); !has(ids, ik) || gone[string(ik)] {
					add("%s key %x: no ids entry for message-id %q, or it is in ids-gone", where, k[:], mv.messageID)
				}
			}
		}
		slots, released := tx.Bucket(bucketSlots), tx.Bucket(bucketReleased)
		if err := slots.ForEachBucket(func(sk []byte) error {
			idx := int64(beUint64(sk))
			rb := released.Bucket(sk)
			n := 0
			err := slots.Bucket(sk).ForEach(func(f, v []byte) error {
				if len(f) != store.KeySize {
					add("slot %d: key %x of %d bytes", idx, f, len(f))
					return nil
				}
				key := keyFromStored(f)
				if key.Due()/s.slotMs != idx || key.Due() >= w {
					add("slot %d: key %x due %d misplaced (watermark %d)", idx, key[:], key.Due(), w)
				}
				if rb != nil && rb.Get(key[:]) != nil {
					// Released: out of the counts, and its ids entry
					// deleted or in ids-gone.
					if mv, err := viewMessage(v); err == nil && mv.flags&flagMessageID != 0 {
						if ik := idKey(mv.vhost, mv.exchange, mv.messageID, key); has(ids, ik) && !gone[string(ik)] {
							add("slot %d key %x: released, but its ids entry is left", idx, key[:])
						}
					}
					return nil
				}
				n++
				message(fmt.Sprintf("slot %d", idx), key, v)
				return nil
			})
			if n == 0 {
				add("slot %d holds no unreleased message", idx)
			}
			return err
		}); err != nil {
			return err
		}
		if err := released.ForEachBucket(func(sk []byte) error {
			idx := int64(beUint64(sk))
			bk := slots.Bucket(sk)
			if bk == nil {
				add("released bucket %d has no slot", idx)
				return nil
			}
			return released.Bucket(sk).ForEach(func(k, _ []byte) error {
				if len(k) != store.KeySize || bk.Get(storedKey(store.Key(k))) == nil {
					add("released bucket %d: key %x is not in its slot", idx, k)
				}
				return nil
			})
		}); err != nil {
			return err
		}
		far := tx.Bucket(bucketFar)
		if err := far.ForEachBucket(func(fk []byte) error {
			idx := int64(beUint64(fk))
			if (idx+1)*s.farMs <= w {
				add("far bucket %d lies behind the watermark %d", idx, w)
			}
			return far.Bucket(fk).ForEach(func(f, v []byte) error {
				if len(f) != store.KeySize {
					add("far bucket %d: key %x of %d bytes", idx, f, len(f))
					return nil
				}
				k := keyFromStored(f)
				if k.Due()/s.farMs != idx {
					add("far bucket %d: key %x due %d misplaced", idx, k[:], k.Due())
				}
				if k.Due() >= w { // below the watermark: a copy already in a slot
					message(fmt.Sprintf("far bucket %d", idx), k, v)
				}
				return nil
			})
		}); err != nil {
			return err
		}
		nids := 0
		if err := ids.ForEach(func(k, _ []byte) error {
			nids++
			if len(k) < idEpochSize {
				add("ids key %x malformed", k)
				return nil
			}
			r := reader{b: k[idEpochSize:]}
			vhost, exchange, id := r.bytes(), r.bytes(), r.bytes()
			if r.err != nil || len(r.b) != store.KeySize || beUint64(k[:idEpochSize]) != idEpoch(store.Key(r.b)) {
				add("ids key %x malformed", k)
				return nil
			}
			v := s.lookup(tx, w, store.Key(r.b))
			if gone[string(k)] {
				if v != nil {
					add("ids entry %x is in ids-gone, but its message is stored", k)
				}
				return nil
			}
			mv, err := viewMessage(v)
			if v == nil || err != nil || !bytes.Equal(mv.vhost, vhost) || !bytes.Equal(mv.exchange, exchange) || !bytes.Equal(mv.messageID, id) {
				add("ids entry %x does not match a stored message", k)
			}
			return nil
		}); err != nil {
			return err
		}
		if nids != withID+len(gone) {
			add("ids index has %d entries, %d messages have a message-id, %d are in ids-gone", nids, withID, len(gone))
		}
		persisted := map[uint64]int64{}
		if err := meta.Bucket(bucketCounts).ForEach(func(k, v []byte) error {
			persisted[beUint64(k)] = int64(beUint64(v))
			return nil
		}); err != nil {
			return err
		}
		stored := map[int64]*tallyRow{}
		if bk := meta.Bucket(bucketTally); bk == nil {
			add("tally bucket missing")
		} else if rows, err := loadTally(bk); err != nil {
			add("tally: %v", err)
		} else {
			stored = rows
		}
		s.mu.RLock()
		defer s.mu.RUnlock()
		eqRow := func(a, b *tallyRow) bool { return *a == *b }
		if !maps.EqualFunc(tallied, stored, eqRow) || !maps.EqualFunc(tallied, s.tally, eqRow) {
			add("tally: %d hours counted from the messages, %d in meta, %d in memory, or their counts differ", len(tallied), len(stored), len(s.tally))
		}
		if !maps.Equal(counted, persisted) || !maps.Equal(counted, s.counts) {
			add("counts per incarnation: stored %v, meta %v, memory %v", counted, persisted, s.counts)
		}
		var live, stale int64
		for inc, n := range counted {
			if _, ok := s.liveIncs()[inc]; ok {
				live += n
			} else {
				stale += n
			}
		}
		if live != s.live || stale != s.stale {
			add("totals: stored live %d stale %d, memory live %d stale %d", live, stale, s.live, s.stale)
		}
		registry := map[exKey]store.ExchangeDef{}
		seen := map[uint64]bool{}
		if err := tx.Bucket(bucketExchanges).ForEach(func(k, v []byte) error {
			d, err := decodeExchange(k, v)
			if err != nil {
				add("exchange %x: %v", k, err)
				return nil
			}
			if d.Incarnation == 0 || d.Incarnation > incCounter || seen[d.Incarnation] {
				add("exchange %q/%q: bad incarnation %d", d.VHost, d.Name, d.Incarnation)
			}
			seen[d.Incarnation] = true
			registry[exKey{d.VHost, d.Name}] = d
			return nil
		}); err != nil {
			return err
		}
		if !maps.EqualFunc(registry, s.exchanges, equalDef) || len(s.liveIncs()) != len(s.exchanges) {
			add("registry in file differs from memory")
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("store: check %s: %w", s.path, errors.Join(errs...))
	}
	return nil
}

func equalDef(a, b store.ExchangeDef) bool {
	return a.VHost == b.VHost && a.Name == b.Name && a.Kind == b.Kind && a.DelayedType == b.DelayedType &&
		a.Durable == b.Durable && a.AutoDelete == b.AutoDelete && a.Internal == b.Internal &&
		bytes.Equal(a.Arguments, b.Arguments) && a.Incarnation == b.Incarnation
}

// has reports whether key is in b.
func has(b *bolt.Bucket, key []byte) bool {
	k, _ := b.Cursor().Seek(key)
	return bytes.Equal(k, key)
}
