package pgstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayproxy/delayproxy/store"
)

// exKey names a registered exchange.
type exKey struct{ vhost, name string }

// Store is the store contract on a PostgreSQL database shared by several
// nodes. All methods are safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	connCfg *pgx.ConnConfig // the listener's own connection
	opts    Options
	schema  string
	shard   int16  // the first of the count and tally rows this node writes (one per committer)
	node    string // this Open's id in the notifications it sends

	// The writer's sequences: [seqNext, seqEnd) of the current block, then
	// the blocks reserved after it. Writer goroutine only.
	seqNext, seqEnd uint64
	seqBlocks       []uint64

	reqs       chan *request   // to the writer goroutine
	stopCtx    context.Context // cancelled by Close: the listener stops
	stopListen context.CancelFunc
	wg         sync.WaitGroup // the writer and the listener

	// closeMu guards closed. Senders on reqs hold it for reading, so Close
	// never closes reqs under a sender.
	closeMu sync.RWMutex
	closed  bool

	// regMu guards the registry cache: the exchanges as last read from the
	// database, by any goroutine that read or changed them, and dead.
	regMu      sync.RWMutex
	exchanges  map[exKey]store.ExchangeDef
	dead       map[uint64]bool // incarnations Stale found dead in the database
	regApplied uint64          // the generation of the reload that filled exchanges
	regGen     atomic.Uint64   // generations handed to reloads

	// statsMu guards stats.
	statsMu sync.Mutex
	stats   Stats
}

var _ store.Store = (*Store)(nil)

// Close finishes the writes already accepted, stops the listener and closes
// the connections. Calls after the first return ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	close(s.reqs)
	s.stopListen()
	s.closeMu.Unlock()
	s.wg.Wait()
	s.pool.Close()
	return nil
}

// isClosed reports whether Close was called.
func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}

// readTimeout bounds the reads of the contract that take no context.
const readTimeout = 10 * time.Second

// readCtx is the context of a read that takes none.
func readCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), readTimeout)
}
