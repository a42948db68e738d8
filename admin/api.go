package admin

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// Paging limits of the message list.
const (
	defaultLimit  = 100
	maxLimit      = 1000
	maxBodyLimit  = 100      // messages per page when bodies are included
	maxBodyBudget = 16 << 20 // body bytes after which a page stops early
)

// rfc3339Milli is RFC 3339 with milliseconds, as the store keeps them.
const rfc3339Milli = "2006-01-02T15:04:05.000Z07:00"

func formatMs(ms int64) string { return time.UnixMilli(ms).UTC().Format(rfc3339Milli) }

func (s *Server) listExchanges(w http.ResponseWriter, r *http.Request) {
	type id struct{ vhost, name string }
	byID := map[id]*Exchange{}
	for _, def := range s.opts.Engine.Exchanges() {
		e := exchangeFromDef(def)
		byID[id{def.VHost, def.Name}] = &e
	}
	var out ExchangeList
	for _, c := range s.opts.Engine.Counts() {
		e := byID[id{c.VHost, c.Exchange}]
		if e == nil {
			if c.Pending == 0 {
				continue
			}
			e = &Exchange{VHost: c.VHost, Name: c.Exchange}
			byID[id{c.VHost, c.Exchange}] = e
		}
		setCount(e, c)
		out.Pending += c.Pending
	}
	out.Exchanges = make([]Exchange, 0, len(byID)) // [] in JSON when there are none
	for _, e := range byID {
		out.Exchanges = append(out.Exchanges, *e)
	}
	slices.SortFunc(out.Exchanges, func(a, b Exchange) int {
		return cmp.Or(strings.Compare(a.VHost, b.VHost), strings.Compare(a.Name, b.Name))
	})
	writeJSON(w, http.StatusOK, out)
}

func exchangeFromDef(def store.ExchangeDef) Exchange {
	return Exchange{
		VHost: def.VHost, Name: def.Name, Kind: kindName(def.Kind), DelayedType: def.DelayedType,
		Durable: def.Durable, AutoDelete: def.AutoDelete, Internal: def.Internal,
		Registered: true,
	}
}

// DefaultExchangeAlias names the default exchange "" in the API's paths,
// as in RabbitMQ's management API: /api/exchanges/%2F/amq.default/messages.
const DefaultExchangeAlias = "amq.default"

// The kinds of Exchange.Kind.
const (
	KindDelayed      = "delayed"       // an x-delayed-message exchange
	KindDeliveryTime = "delivery-time" // any exchange holding x-opt-delivery-time/-delay messages
)

func kindName(k store.ExchangeKind) string {
	if k == store.KindDeliveryTime {
		return KindDeliveryTime
	}
	return KindDelayed
}

func setCount(e *Exchange, c store.ExchangeCount) {
	e.Pending = c.Pending
	if c.Pending > 0 && c.NextDue > 0 {
		e.NextDue, e.NextDueMs = formatMs(c.NextDue), c.NextDue
	}
}

// exchange resolves {vhost}/{name}, writing a 404 when it is not a delayed
// exchange.
func (s *Server) exchange(w http.ResponseWriter, r *http.Request) (store.ExchangeDef, bool) {
	vhost, name := pathValue(r, "vhost"), pathValue(r, "name")
	if name == DefaultExchangeAlias {
		name = ""
	}
	def, ok := s.opts.Engine.Exchange(vhost, name)
	if !ok {
		writeError(w, http.StatusNotFound, "no delayed exchange %q in vhost %q", name, vhost)
	}
	return def, ok
}

func (s *Server) getExchange(w http.ResponseWriter, r *http.Request) {
	def, ok := s.exchange(w, r)
	if !ok {
		return
	}
	e := exchangeFromDef(def)
	for _, c := range s.opts.Engine.Counts() {
		if c.VHost == def.VHost && c.Exchange == def.Name {
			setCount(&e, c)
			break
		}
	}
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	withBody := false
	if v := q.Get("body"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "body=%q: want true or false", v)
			return
		}
		withBody = b
	}
	limit, most := defaultLimit, maxLimit
	if withBody {
		limit, most = maxBodyLimit, maxBodyLimit
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > most {
			writeError(w, http.StatusBadRequest, "limit=%q: want a number from 1 to %d", v, most)
			return
		}
		limit = n
	}
	var after store.Key
	if v := q.Get("after"); v != "" {
		k, err := parseKey(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "after=%q: %v", v, err)
			return
		}
		after = k
	}
	def, ok := s.exchange(w, r)
	if !ok {
		return
	}
	msgs, err := s.opts.Engine.List(def.VHost, def.Name, after, limit, withBody)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	page := MessagePage{Messages: make([]Message, 0, len(msgs))}
	budget := maxBodyBudget
	full := len(msgs) == limit
	for i, m := range msgs {
		mj := Message{
			Key: hex.EncodeToString(m.Key[:]), Due: formatMs(m.Due), DueMs: m.Due,
			DelayMs: m.Delay, Priority: m.Priority, RoutingKey: m.RoutingKey,
			MessageID: m.MessageID, Mandatory: m.Mandatory,
		}
		if withBody {
			if i > 0 && len(m.Body) > budget {
				full = true // more to fetch: stop this page early
				break
			}
			budget -= len(m.Body)
			size := len(m.Body)
			mj.Size, mj.Body = &size, m.Body
		}
		page.Messages = append(page.Messages, mj)
	}
	if n := len(page.Messages); full && n > 0 {
		page.NextAfter = page.Messages[n-1].Key
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) cancelExchange(w http.ResponseWriter, r *http.Request) {
	def, ok := s.exchange(w, r)
	if !ok {
		return
	}
	n, err := s.opts.Engine.CancelExchange(r.Context(), def.VHost, def.Name)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	s.cancelled(r, int(n), "vhost", def.VHost, "exchange", def.Name, "scope", "all")
	writeJSON(w, http.StatusOK, Cancelled{Cancelled: n})
}

func (s *Server) cancelID(w http.ResponseWriter, r *http.Request) {
	def, ok := s.exchange(w, r)
	if !ok {
		return
	}
	id := pathValue(r, "id")
	keys, err := s.opts.Engine.Cancel(r.Context(), def.VHost, def.Name, id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	n := len(keys)
	if n == 0 {
		writeError(w, http.StatusNotFound, "no pending message with message-id %q in delayed exchange %q of vhost %q", id, def.Name, def.VHost)
		return
	}
	s.cancelled(r, n, "vhost", def.VHost, "exchange", def.Name, "message_id", id)
	writeJSON(w, http.StatusOK, Cancelled{Cancelled: int64(n)})
}

func (s *Server) cancelKey(w http.ResponseWriter, r *http.Request) {
	key, err := parseKey(pathValue(r, "key"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "key %q: %v", pathValue(r, "key"), err)
		return
	}
	def, ok := s.exchange(w, r)
	if !ok {
		return
	}
	// The key must be a pending message of this exchange (of its current
	// incarnation: older ones are already cancelled).
	msgs, err := s.opts.Engine.Get([]store.Key{key})
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	m := msgs[0]
	found := m != nil && m.VHost == def.VHost && m.Exchange == def.Name && m.Incarnation == def.Incarnation
	if found {
		found, err = s.opts.Engine.CancelKey(r.Context(), key)
		if err != nil {
			s.storeError(w, r, err)
			return
		}
	}
	if !found {
		writeError(w, http.StatusNotFound, "no pending message with key %x in delayed exchange %q of vhost %q", key[:], def.Name, def.VHost)
		return
	}
	s.cancelled(r, 1, "vhost", def.VHost, "exchange", def.Name, "key", hex.EncodeToString(key[:]))
	writeJSON(w, http.StatusOK, Cancelled{Cancelled: 1})
}

// cancelled counts and logs (an audit line) a successful cancellation.
func (s *Server) cancelled(r *http.Request, n int, attrs ...any) {
	s.opts.Metrics.Cancelled(n)
	s.log.Info("delayed messages cancelled by admin API",
		append(attrs, "count", n, "remote", r.RemoteAddr)...)
}

// storeError answers an Engine failure: 503 when the store is closed
// (shutting down), else 500.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, store.ErrUnknownExchange) { // deleted meanwhile
		writeError(w, http.StatusNotFound, "%v", err)
		return
	}
	if errors.Is(err, store.ErrClosed) {
		writeError(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.log.Error("admin API store error", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "%v", err)
}

// parseKey decodes a store key from 34 hex digits.
func parseKey(s string) (store.Key, error) {
	var k store.Key
	if len(s) != 2*store.KeySize {
		return k, fmt.Errorf("want %d hex digits, got %d characters", 2*store.KeySize, len(s))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, errors.New("not hex")
	}
	return k, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, ErrorResponse{Error: fmt.Sprintf(format, args...)})
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}
