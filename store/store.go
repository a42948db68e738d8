package store

import "context"

// Store is the durable half of the delay engine.
type Store interface {
	Put(ctx context.Context, msgs ...*Message) error
	Get(keys []Key) ([]*Message, error)
	Delete(ctx context.Context, keys ...Key) error
	ScanKeys(from, until int64, fn func(Key) error) error
	NextDue() (int64, bool)
	Stale(m *Message) bool

	PutExchange(ctx context.Context, def *ExchangeDef) error
	DeleteExchange(ctx context.Context, vhost, name string) (int64, error)
	Exchange(vhost, name string) (ExchangeDef, bool)
	Exchanges() []ExchangeDef

	Pending() int64
	Count(vhost, exchange string) int64
	Counts() []ExchangeCount

	List(vhost, exchange string, after Key, limit int, withBody bool) ([]*Message, error)
	Cancel(ctx context.Context, vhost, exchange, messageID string) (int, error)
	CancelKey(ctx context.Context, key Key) (bool, error)
	CancelExchange(ctx context.Context, vhost, exchange string) (int64, error)

	Close() error
}
