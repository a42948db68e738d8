package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy/admin"
)

// adminClient talks to a running proxy's admin API (package admin). It
// decodes the answers into admin's own types (admin/schema.go), so that
// --json prints what the API says.
type adminClient struct {
	base  string // scheme, host and any path prefix, e.g. http://127.0.0.1:15673
	token string // "" sends no Authorization header
	http  *http.Client
}

// requestTimeout bounds one API request; the server's own write timeout is
// 60 s.
const requestTimeout = 60 * time.Second

// errUnreachable wraps a failure to reach the server at all (connection
// refused, unknown host, timeout), as opposed to an answer that is an error.
var errUnreachable = errors.New("cannot reach delayproxy")

// apiError is an answer other than 2xx: the HTTP status and the API's
// {"error": "..."} text.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// statusOf is the HTTP status of an apiError in err's chain, or 0.
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status
	}
	return 0
}

// newAdminClient parses the server address: host:port, or an http(s) URL.
// An unspecified host (":15673", "0.0.0.0:15673") means this machine
// (admin.DialAddr).
func newAdminClient(server, token string) (*adminClient, error) {
	raw := server
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		return nil, fmt.Errorf("--server %q: want host:port or http(s)://host:port", server)
	}
	u.Host = admin.DialAddr(u.Host)
	u.RawQuery, u.Fragment = "", ""
	base := strings.TrimSuffix(u.String(), "/")
	return &adminClient{base: base, token: token, http: &http.Client{Timeout: requestTimeout}}, nil
}

// exchangePath is /api/exchanges/{vhost}/{name}, each segment escaped
// ("/" is %2F, as the API and RabbitMQ's management API want; the default
// exchange "" is amq.default).
func exchangePath(vhost, name string) string {
	if name == "" {
		name = admin.DefaultExchangeAlias
	}
	return "/api/exchanges/" + url.PathEscape(vhost) + "/" + url.PathEscape(name)
}

// do sends one request and decodes a 2xx JSON answer into out.
func (c *adminClient) do(ctx context.Context, method, path string, query url.Values, out any) error {
	u := c.base + path // path is escaped already
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s (is it running, and is --server its --http-addr?): %v", errUnreachable, c.base, unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e admin.ErrorResponse
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if msg == "" {
			msg = resp.Status
		}
		return &apiError{status: resp.StatusCode, msg: msg}
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s %s: not the admin API's JSON (is %s a delayproxy?): %v", method, path, c.base, err)
	}
	return nil
}

// unwrapURLError drops net/http's "Get \"url\": " prefix; the caller names
// the server already.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func (c *adminClient) exchanges(ctx context.Context) (admin.ExchangeList, error) {
	var out admin.ExchangeList
	err := c.do(ctx, http.MethodGet, "/api/exchanges", nil, &out)
	return out, err
}

func (c *adminClient) exchange(ctx context.Context, vhost, name string) (admin.Exchange, error) {
	var out admin.Exchange
	err := c.do(ctx, http.MethodGet, exchangePath(vhost, name), nil, &out)
	return out, err
}

// messages reads one page of pending messages after the key after ("" from
// the start).
func (c *adminClient) messages(ctx context.Context, vhost, name, after string, limit int, withBody bool) (admin.MessagePage, error) {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if after != "" {
		q.Set("after", after)
	}
	if withBody {
		q.Set("body", "true")
	}
	var out admin.MessagePage
	err := c.do(ctx, http.MethodGet, exchangePath(vhost, name)+"/messages", q, &out)
	return out, err
}

func (c *adminClient) cancelID(ctx context.Context, vhost, name, id string) (int64, error) {
	var out admin.Cancelled
	err := c.do(ctx, http.MethodDelete, exchangePath(vhost, name)+"/messages/"+url.PathEscape(id), nil, &out)
	return out.Cancelled, err
}

func (c *adminClient) cancelKey(ctx context.Context, vhost, name, key string) (int64, error) {
	var out admin.Cancelled
	err := c.do(ctx, http.MethodDelete, exchangePath(vhost, name)+"/messages/by-key/"+url.PathEscape(key), nil, &out)
	return out.Cancelled, err
}

func (c *adminClient) cancelAll(ctx context.Context, vhost, name string) (int64, error) {
	var out admin.Cancelled
	err := c.do(ctx, http.MethodDelete, exchangePath(vhost, name)+"/messages", nil, &out)
	return out.Cancelled, err
}

func (c *adminClient) upcoming(ctx context.Context) (admin.Upcoming, error) {
	var out admin.Upcoming
	err := c.do(ctx, http.MethodGet, "/api/upcoming", nil, &out)
	return out, err
}
