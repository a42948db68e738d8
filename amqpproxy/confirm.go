package amqpproxy

import "slices"

// confirms is the publisher-confirm state of one channel in confirm mode.
//
// The client counts every basic.publish it sends after confirm.select (its
// delivery tags, from 1). RabbitMQ counts only the publishes the proxy relays.
// The two sequences part as soon as the proxy answers a publish itself, so
// confirms keeps both and translates:
//
//	client tags   1  2  3  4  5  6
//	relayed?      y  y  n  y  n  y      (n: taken over, answered locally)
//	upstream tag  1  2  -  3  -  4
//
// An upstream ack or nack (single or multiple) is turned into the set of
// client tags it covers; that set is sent to the client as one multiple=true
// frame for the tags below the lowest client tag still pending, and single
// frames for the rest, so that multiple=true never spans a pending tag.
//
// confirms is not safe for concurrent use; the channel's mutex guards it.
type confirms struct {
	lastClient uint64 // last client tag given out
	lastUp     uint64 // last upstream tag given out

	// relayed[i] is the client tag of upstream tag upBase+i, or 0 once
	// upstream confirmed it. Upstream tags are contiguous, so lookup is O(1).
	upBase  uint64
	relayed deque[uint64]

	// done[i] reports whether client tag clBase+i has been confirmed to the
	// client. clBase is the lowest client tag still pending (or lastClient+1).
	clBase uint64
	done   deque[bool]
}

func newConfirms() *confirms { return &confirms{upBase: 1, clBase: 1} }

// publish gives the next client tag to a publish; it is pending until
// confirmed by mark.
func (c *confirms) publish() uint64 {
	c.lastClient++
	c.done.push(false)
	return c.lastClient
}

// relay records that client tag ct goes upstream, where it gets the next
// upstream tag.
func (c *confirms) relay(ct uint64) {
	c.lastUp++
	c.relayed.push(ct)
}

// fromUpstream appends to dst the client tags that an upstream confirm of tag
// (with multiple) covers and that are still unconfirmed upstream. Unknown or
// already confirmed tags add nothing.
func (c *confirms) fromUpstream(dst []uint64, tag uint64, multiple bool) []uint64 {
	if tag < c.upBase || tag > c.lastUp {
		return dst
	}
	if multiple {
		for c.relayed.len() > 0 && c.upBase <= tag {
			if ct := c.relayed.popFront(); ct != 0 {
				dst = append(dst, ct)
			}
			c.upBase++
		}
	} else if p := c.relayed.at(int(tag - c.upBase)); *p != 0 {
		dst = append(dst, *p)
		*p = 0
	}
	for c.relayed.len() > 0 && *c.relayed.at(0) == 0 {
		c.relayed.popFront()
		c.upBase++
	}
	return dst
}

// pending reports whether client tag t awaits its confirm.
func (c *confirms) pending(t uint64) bool {
	return t >= c.clBase && t <= c.lastClient && !*c.done.at(int(t - c.clBase))
}

// mark records that tags (all of the same kind: ack or nack) are confirmed
// now, and calls emit with the frames to send the client. Tags that are not
// pending are skipped.
//
// One multiple=true frame covers the longest run of tags of the set that
// starts at the lowest pending tag and leaves no gap; every other tag gets a
// single frame. A multiple=true frame therefore never spans a tag that is
// still pending, nor one confirmed earlier on its own: amqp091-go applies a
// multiple frame's ack/nack to every tag from its lowest unconfirmed one,
// including tags it already holds out of order, so spanning those could turn
// an earlier nack into an ack.
func (c *confirms) mark(tags []uint64, emit func(tag uint64, multiple bool)) {
	if !slices.IsSorted(tags) {
		slices.Sort(tags)
	}
	n := 0
	for _, t := range tags {
		if c.pending(t) && (n == 0 || tags[n-1] != t) {
			*c.done.at(int(t - c.clBase)) = true
			tags[n] = t
			n++
		}
	}
	tags = tags[:n]
	run := 0 // tags[:run] are clBase, clBase+1, ... without a gap
	for run < len(tags) && tags[run] == c.clBase+uint64(run) {
		run++
	}
	for c.done.len() > 0 && *c.done.at(0) {
		c.done.popFront()
		c.clBase++
	}
	if run > 0 {
		emit(tags[run-1], run > 1)
	}
	for _, t := range tags[run:] {
		emit(t, false)
	}
}
