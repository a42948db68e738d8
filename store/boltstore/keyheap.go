package boltstore

import "github.com/delayproxy/delayproxy/store"

// keyHeap is a max-heap of keys.
type keyHeap []store.Key

func (h keyHeap) Len() int { return len(h) }

func (h keyHeap) Less(i, j int) bool { return store.CompareKeys(h[i], h[j]) > 0 }

func (h keyHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *keyHeap) Push(x any) { *h = append(*h, x.(store.Key)) }

func (h *keyHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	*h = old[:len(old)-1]
	return k
}
