package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
)

// Errors returned by New and Start.
var (
	// ErrNoToken: the address is not loopback and no token was given.
	ErrNoToken = errors.New("admin: a token is required on a non-loopback address")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("admin: server already started")
)

// Timeouts of the HTTP server.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 60 * time.Second // a page of bodies may be large
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 64 << 10
	readyTimeout      = 3 * time.Second
)

// Engine is what the admin API reads and cancels. Once a Cancel method has
// returned, the messages it removed are never released: the application's
// Engine also takes them out of the scheduler's in-memory wheel.
type Engine interface {
	// Counts lists pending messages per delayed exchange.
	Counts() []store.ExchangeCount
	// Exchanges lists the registered delayed exchanges.
	Exchanges() []store.ExchangeDef
	// Exchange looks up one delayed exchange.
	Exchange(vhost, name string) (store.ExchangeDef, bool)
	// List pages through an exchange's pending messages in release order,
	// starting after the key after (the zero Key starts at the beginning).
	List(vhost, exchange string, after store.Key, limit int, withBody bool) ([]*store.Message, error)
	// Cancel removes every pending message of the exchange with that
	// message-id and returns the keys it removed.
	Cancel(ctx context.Context, vhost, exchange, messageID string) ([]store.Key, error)
	// Get reads messages by key; nil entries for keys not stored.
	Get(keys []store.Key) ([]*store.Message, error)
	// CancelKey removes one pending message; false if it was not pending.
	CancelKey(ctx context.Context, key store.Key) (bool, error)
	// CancelExchange removes every pending message of the exchange.
	CancelExchange(ctx context.Context, vhost, exchange string) (int64, error)
	// Upcoming counts the stored messages by due time in consecutive
	// ranges, at the cost of the time span they cover, not of their number.
	// bounds are ascending unix ms; the result has len(bounds)+1 counts: due
	// before bounds[0], then in [bounds[i-1], bounds[i]) for each i, then
	// at or after the last bound. Stale messages (of a deleted or cancelled
	// exchange, until they are discarded at their turn) are counted too. A
	// store may place a message by its due time rounded down to its
	// resolution (its doc says which); bounds that are multiples of it
	// count exactly.
	Upcoming(bounds []int64) []int64
}

// Options configure a Server.
type Options struct {
	// Addr is the listen address, e.g. "127.0.0.1:15673".
	Addr string
	// Token is the bearer token of /api/; "" means no authentication,
	// allowed only on a loopback Addr.
	Token string
	// Engine serves the admin API. Required.
	Engine Engine
	// Metrics serves /metrics and counts cancellations. Required.
	Metrics *metrics.Metrics
	// Ready reports readiness for /readyz (store open, upstream reachable);
	// nil means always ready. It gets a context with a short deadline.
	Ready func(context.Context) error
	// Logger receives request errors and an audit line per cancellation;
	// nil discards.
	Logger *slog.Logger
	// Version is shown on the status page and in /api/status.
	Version string
}

// Server is the admin HTTP server.
type Server struct {
	opts    Options
	handler http.Handler
	log     *slog.Logger
	now     func() time.Time // the clock of /api/upcoming's ranges and of the status history
	hist    history          // the status page's recent metrics (history.go)
	node    string           // this node's name in /api/status: the host name

	mu       sync.Mutex // guards srv, ln, done, stopHist and histDone
	srv      *http.Server
	ln       net.Listener
	done     chan struct{} // closed when Serve has returned
	serveErr error         // Serve's error other than ErrServerClosed; read after done
	stopHist func()        // stops the status history's goroutine
	histDone chan struct{} // closed when it has returned
}

// New checks opts and builds the server; it does not listen yet.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil || opts.Metrics == nil {
		return nil, errors.New("admin: Options.Engine and Options.Metrics are required")
	}
	if opts.Token == "" && !IsLoopback(opts.Addr) {
		return nil, fmt.Errorf("%w (%s)", ErrNoToken, opts.Addr)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{opts: opts, log: log, now: time.Now}
	s.node, _ = os.Hostname()
	s.handler = s.routes()
	return s, nil
}

// Handler is the server's full handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("GET /api/exchanges", s.listExchanges)
	api.HandleFunc("GET /api/exchanges/{vhost}/{name}", s.getExchange)
	api.HandleFunc("GET /api/exchanges/{vhost}/{name}/messages", s.listMessages)
	api.HandleFunc("DELETE /api/exchanges/{vhost}/{name}/messages", s.cancelExchange)
	api.HandleFunc("DELETE /api/exchanges/{vhost}/{name}/messages/{id}", s.cancelID)
	api.HandleFunc("DELETE /api/exchanges/{vhost}/{name}/messages/by-key/{key}", s.cancelKey)
	api.HandleFunc("GET /api/upcoming", s.upcoming)
	api.HandleFunc("GET /api/status", s.status)
	// Method-less twins answer other methods with a JSON 405, and the
	// catch-all a JSON 404, instead of the mux's plain-text ones.
	for path, allow := range map[string]string{
		"/api/exchanges":                                      "GET, HEAD",
		"/api/exchanges/{vhost}/{name}":                       "GET, HEAD",
		"/api/exchanges/{vhost}/{name}/messages":              "GET, HEAD, DELETE",
		"/api/exchanges/{vhost}/{name}/messages/{id}":         "DELETE",
		"/api/exchanges/{vhost}/{name}/messages/by-key/{key}": "DELETE",
		"/api/upcoming":                                       "GET, HEAD",
		"/api/status":                                         "GET, HEAD",
	} {
		api.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method %s not allowed; allowed: %s", r.Method, allow)
		})
	}
	api.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such API path: %s", r.URL.Path)
	})

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.opts.Metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("/api/", s.auth(escapeSegments(api)))
	pageRoutes(mux)
	return mux
}

// auth enforces the bearer token, if any, in constant time.
func (s *Server) auth(next http.Handler) http.Handler {
	if s.opts.Token == "" {
		return next
	}
	want := sha256.Sum256([]byte(s.opts.Token)) // equal lengths: no length leak
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r)
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="delayproxy"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// escapeSegments escapes every segment of the request path once more before
// the API mux sees it, and pathValue undoes it. ServeMux never matches a
// {wildcard} against a segment that unescapes to "/" (it takes it for a
// trailing slash), and the default vhost "/" arrives as exactly that: %2F.
// Escaped twice, %2F reaches the mux as %252F, matches, and pathValue
// turns it back into "/". Literal segments (api, exchanges, messages,
// by-key) are unchanged by escaping.
func escapeSegments(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		segs := strings.Split(r.URL.EscapedPath(), "/")
		for i, seg := range segs {
			segs[i] = url.PathEscape(seg)
		}
		u := *r.URL
		u.RawPath = strings.Join(segs, "/")
		u.Path = r.URL.EscapedPath() // = PathUnescape(u.RawPath)
		r2 := r.WithContext(r.Context())
		r2.URL = &u
		next.ServeHTTP(w, r2)
	})
}

// pathValue is the unescaped path segment of the named wildcard (see
// escapeSegments).
func pathValue(r *http.Request, name string) string {
	v, err := url.PathUnescape(r.PathValue(name))
	if err != nil {
		return r.PathValue(name)
	}
	return v
}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.opts.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := s.opts.Ready(ctx); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	writeText(w, http.StatusOK, "ok")
}

// Start listens on Options.Addr and serves in the background until
// Shutdown. Listen errors (address in use) are returned here.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return ErrStarted
	}
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.done = make(chan struct{})
	srv, done := s.srv, s.done
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.serveErr = err
			s.log.Error("admin HTTP server stopped", "err", err)
		}
	}()
	ctx, stop := context.WithCancel(context.Background())
	histDone := make(chan struct{})
	s.stopHist, s.histDone = stop, histDone
	go func() {
		defer close(histDone)
		s.sampleLoop(ctx)
	}()
	return nil
}

// Addr is the bound address after Start, nil before.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Shutdown stops accepting, waits for requests in flight until ctx ends
// (then closes them), and waits for the serving goroutine and the status
// history's.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, done, stopHist, histDone := s.srv, s.done, s.stopHist, s.histDone
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	stopHist()
	<-histDone
	err := srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, srv.Close())
	}
	<-done
	if s.serveErr != nil {
		err = errors.Join(err, s.serveErr)
	}
	return err
}

// IsLoopback reports whether host:port names a loopback host ("localhost",
// 127.0.0.0/8 or ::1). An empty or unspecified host listens everywhere and is
// not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DialAddr is the address at which this machine reaches a server listening
// on addr (host:port): loopback when the host is empty or unspecified
// (":15673", "0.0.0.0:15673", "[::]:15673": everywhere, as in
// DELAYPROXY_HTTP_ADDR inside a container), else addr itself, as it is
// when it has no port.
func DialAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch ip := net.ParseIP(host); {
	case host == "":
		return net.JoinHostPort("127.0.0.1", port)
	case ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		return net.JoinHostPort("127.0.0.1", port)
	case ip != nil && ip.IsUnspecified():
		return net.JoinHostPort("::1", port)
	}
	return addr
}

// Probe GETs http://addr/path and returns nil on 200 OK. An unspecified host
// is probed on loopback (DialAddr). It backs the `delayproxy healthcheck`
// command used by container health checks.
func Probe(ctx context.Context, addr, path string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("probe: %q: %w", addr, err)
	}
	u := "http://" + DialAddr(addr) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe: %s: %s %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
