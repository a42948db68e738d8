// Package store is the contract of the delay engine's durable half: the
// Store interface and the types it speaks (Key, Message, ExchangeDef,
// ExchangeCount, CommitInfo, the sentinel errors).
package store
