// Package admin is delayproxy's HTTP side: Prometheus metrics, health and
// readiness probes, a small JSON API to count, list and cancel delayed
// messages, and a status page for people.
//
// Routes (method + pattern, net/http ServeMux):
//
//	GET    /                                             the status page (no token; it reads /api/ with one)
//	GET    /ui/status.css, /ui/status.js, /ui/favicon.svg its assets, embedded (no token)
//	GET    /metrics                                      Prometheus exposition (no token)
//	GET    /healthz                                      200 while the process serves (no token)
//	GET    /readyz                                       200 when Options.Ready says so, else 503 (no token)
//	GET    /api/exchanges                                delayed exchanges, pending counts, next due
//	GET    /api/exchanges/{vhost}/{name}                 one delayed exchange
//	GET    /api/exchanges/{vhost}/{name}/messages        pending messages, paged (?after=KEYHEX&limit=N&body=true)
//	DELETE /api/exchanges/{vhost}/{name}/messages        cancel every pending message of the exchange
//	DELETE /api/exchanges/{vhost}/{name}/messages/{id}   cancel the messages with that message-id
//	DELETE /api/exchanges/{vhost}/{name}/messages/by-key/{key}  cancel one message by its store key (hex)
//	GET    /api/upcoming                                 stored messages by due time: overdue, next minute, hour, day, week, later
//	GET    /api/status                                   totals, rates and release lateness of the last minutes, connections, the releaser's state
//
// Path segments are URL-escaped; the default vhost "/" is %2F, as in
// RabbitMQ's management API. Each JSON answer is one of this package's
// exported types (schema.go), which delayproxy's CLI decodes.
//
// Invariants:
//   - Everything under /api/ needs "Authorization: Bearer <token>" when a
//     token is configured, compared in constant time, and is checked before
//     anything else (a wrong token never learns whether a path exists).
//   - New refuses a non-loopback address without a token: the admin API can
//     cancel messages.
//   - Errors are JSON {"error": "..."}: 400 bad input, 401 no or wrong token,
//     404 unknown exchange or message, 405 wrong method, 500 store failure,
//     503 store closed.
//   - Responses are bounded: a page holds at most 1000 messages, at most 100
//     with bodies, and stops early after 16 MiB of bodies.
//   - The status page and its assets hold no data and load nothing from
//     elsewhere (a Content Security Policy of 'self' only); the page sends
//     the token from sessionStorage as the bearer header, never in a URL
//     the server sees.
//   - /api/status reads the process's own metrics (metrics.Snapshot) and
//     the exchange registry, never the stored messages: one goroutine,
//     started by Start and waited for by Shutdown, keeps a snapshot every
//     5 s for 5 minutes (history.go).
package admin
