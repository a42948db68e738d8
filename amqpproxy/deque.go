package amqpproxy

// deque is a FIFO with O(1) push, pop and index; it compacts itself so its
// memory follows the number of live elements.
type deque[T any] struct {
	buf  []T
	head int
}

func (d *deque[T]) len() int { return len(d.buf) - d.head }

func (d *deque[T]) push(v T) { d.buf = append(d.buf, v) }

// at returns the i-th live element (0 is the front).
func (d *deque[T]) at(i int) *T { return &d.buf[d.head+i] }

func (d *deque[T]) popFront() T {
	var zero T
	v := d.buf[d.head]
	d.buf[d.head] = zero
	d.head++
	switch {
	case d.head == len(d.buf):
		d.buf, d.head = d.buf[:0], 0
	case d.head >= 1024 && d.head*2 >= len(d.buf):
		n := copy(d.buf, d.buf[d.head:])
		clear(d.buf[n:])
		d.buf, d.head = d.buf[:n], 0
	}
	return v
}
