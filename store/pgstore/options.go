package pgstore

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// Defaults of Options.
const (
	DefaultSchema         = "delayproxy"
	defaultMaxBatch       = 10000
	defaultCommitters     = 4
	defaultReloadInterval = 5 * time.Second
	defaultNotifyWithin   = time.Minute
)

// Options tune the PostgreSQL store. The zero value is a good default.
type Options struct {
	// Schema is the PostgreSQL schema holding the store's tables, created
	// when missing; several clusters can share a database under different
	// schemas. Default "delayproxy".
	Schema string
	// MaxBatch is the most messages and deletes in one group commit;
	// default 10000.
	MaxBatch int
	// Committers is how many group commits may be in flight at once, each
	// its own transaction on its own connection (and its own count and
	// tally rows, so that they do not wait for each other's locks).
	// Default 4.
	Committers int
	// ReloadInterval is how often the registry is read again in full, the
	// backstop of the notifications other nodes send when they change it.
	// Default 5s.
	ReloadInterval time.Duration
	// NotifyWithin: a Put announces (NOTIFY, delivered at commit) the keys
	// of its messages due before now+NotifyWithin, to OnNotify of every
	// node. Default 1m; negative: never.
	NotifyWithin time.Duration
	// OnNotify, when set, is called with the keys other nodes (and this
	// one) announced, each with its partition: messages due soon,
	// committed. It runs on the listener goroutine and must return
	// quickly; it must not call the Store's write methods.
	OnNotify func(keys []Announced)
	// OnCancel, when set, is called with the keys of messages due before
	// now+NotifyWithin that other nodes cancelled (by message-id or key),
	// at their commit, so that the releasing node leaves out a message it
	// has read ahead. Same rules as OnNotify.
	OnCancel func(keys []store.Key)
	// OnMissed, when set, is called when announcements may have been
	// missed: the listener lost its connection and listens again. The
	// scheduler then reads its loaded horizon again. Same rules as
	// OnNotify.
	OnMissed func()
	// Now is the wall clock NotifyWithin is measured from; nil: time.Now.
	Now func() time.Time
	// Metrics, when set, hears of every group commit (commit latency and
	// batch size histograms); *metrics.Metrics is one.
	Metrics Metrics
	// Logger reports what the store recovers from by itself (a lost
	// listener connection); nil: slog.Default().
	Logger *slog.Logger
}

// Metrics is what the store reports to. Commit is called by the writer
// goroutine after every commit: it must return quickly and must not call
// the Store.
type Metrics interface {
	Commit(store.CommitInfo)
}

// schemaName is what Options.Schema may be: a plain lower-case SQL
// identifier, so that it never needs quoting in statements or channels.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// CheckSchema says why name cannot be Options.Schema, or nil.
func CheckSchema(name string) error {
	if !schemaName.MatchString(name) {
		return fmt.Errorf("schema name %q: want lower-case letters, digits and _ (at most 48), not starting with a digit", name)
	}
	return nil
}

func (o Options) normalize() (Options, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if err := CheckSchema(o.Schema); err != nil {
		return o, err
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.Committers <= 0 {
		o.Committers = defaultCommitters
	}
	o.Committers = min(o.Committers, shards)
	if o.ReloadInterval <= 0 {
		o.ReloadInterval = defaultReloadInterval
	}
	if o.NotifyWithin == 0 {
		o.NotifyWithin = defaultNotifyWithin
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
