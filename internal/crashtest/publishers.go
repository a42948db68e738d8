package crashtest

import (
	"context"
	"sync"
)

// Publishers are Publishers run side by side until Stop.
type Publishers struct {
	list   []*Publisher
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per Publisher's Run
}

// StartPublishers runs the n Publishers mk makes (mk(0) ... mk(n-1)), each
// in a goroutine of its own, until Stop.
func StartPublishers(n int, mk func(i int) *Publisher) *Publishers {
	ctx, cancel := context.WithCancel(context.Background())
	ps := &Publishers{cancel: cancel}
	for i := range n {
		p := mk(i)
		ps.list = append(ps.list, p)
		ps.wg.Go(func() { p.Run(ctx) })
	}
	return ps
}

// All are the publishers, in mk's order.
func (ps *Publishers) All() []*Publisher { return ps.list }

// Ledgers are the publishers' ledgers as they are now, in mk's order.
func (ps *Publishers) Ledgers() []Ledger {
	ls := make([]Ledger, len(ps.list))
	for i, p := range ps.list {
		ls[i] = p.Ledger()
	}
	return ls
}

// Confirmed is how many publishes the proxy has confirmed so far, over
// every publisher.
func (ps *Publishers) Confirmed() int {
	n := 0
	for _, l := range ps.Ledgers() {
		n += len(l.Confirmed)
	}
	return n
}

// Every reports whether f holds for every publisher's ledger as it is now.
func (ps *Publishers) Every(f func(Ledger) bool) bool {
	for _, p := range ps.list {
		if !f(p.Ledger()) {
			return false
		}
	}
	return true
}

// Stop ends every Run (each waits for the answers still due) and returns
// the final ledgers.
func (ps *Publishers) Stop() []Ledger {
	ps.cancel()
	ps.wg.Wait()
	return ps.Ledgers()
}
