package admin

// The admin API's JSON answers, one type each: the handlers encode them and
// delayproxy's CLI decodes them, so that the two cannot drift apart. Times
// come twice, as RFC 3339 in UTC with milliseconds ("2030-01-02T03:04:05.678Z")
// and as unix milliseconds in the field of the same name ending in _ms.

// ExchangeList is the answer of GET /api/exchanges: every registered
// exchange (delayed, or holding delivery-time messages), and every deleted one that still holds messages, sorted
// by vhost, then name.
type ExchangeList struct {
	Exchanges []Exchange `json:"exchanges"`
	// Pending is the sum of the exchanges' pending messages.
	Pending int64 `json:"pending"`
}

// Exchange is one delayed exchange: the answer of GET
// /api/exchanges/{vhost}/{name} and an element of ExchangeList.
type Exchange struct {
	VHost string `json:"vhost"`
	Name  string `json:"name"`
	// Kind is why the exchange is registered: KindDelayed, or
	// KindDeliveryTime for an ordinary exchange (the default exchange ""
	// included) holding messages published with x-opt-delivery-time or
	// x-opt-delivery-delay; "" for a deleted exchange still holding
	// messages.
	Kind string `json:"kind,omitempty"`
	// DelayedType is the exchange's x-delayed-type argument; "" for a
	// deleted exchange still holding messages.
	DelayedType string `json:"type,omitempty"`
	Durable     bool   `json:"durable"`
	AutoDelete  bool   `json:"auto_delete"`
	Internal    bool   `json:"internal"`
	// Registered is false for a deleted exchange: its messages await
	// discarding at their due time.
	Registered bool  `json:"registered"`
	Pending    int64 `json:"pending"`
	// NextDue is when the first pending message is due; absent when none
	// is pending.
	NextDue   string `json:"next_due,omitempty"`
	NextDueMs int64  `json:"next_due_ms,omitempty"`
}

// MessagePage is the answer of GET /api/exchanges/{vhost}/{name}/messages:
// pending messages in release order.
type MessagePage struct {
	Messages []Message `json:"messages"`
	// NextAfter is the key to pass as ?after= for the next page; absent on
	// the last page.
	NextAfter string `json:"next_after,omitempty"`
}

// Message is one pending message of a MessagePage.
type Message struct {
	// Key is the store key in hex: the cursor for ?after= and the id of
	// DELETE .../messages/by-key/{key}.
	Key        string `json:"key"`
	Due        string `json:"due"`
	DueMs      int64  `json:"due_ms"`
	DelayMs    int64  `json:"delay_ms"` // the x-delay it was published with
	Priority   uint8  `json:"priority"`
	RoutingKey string `json:"routing_key"`
	MessageID  string `json:"message_id,omitempty"`
	Mandatory  bool   `json:"mandatory"`
	// Size and Body (base64 in JSON) are there only with ?body=true: a
	// page without bodies does not read them. An empty body is absent,
	// with size 0.
	Size *int   `json:"size,omitempty"`
	Body []byte `json:"body,omitempty"`
}

// Cancelled is the answer of each DELETE: how many pending messages it
// cancelled.
type Cancelled struct {
	Cancelled int64 `json:"cancelled"`
}

// ErrorResponse is the body of every answer other than 2xx.
type ErrorResponse struct {
	Error string `json:"error"`
}

// Upcoming is the answer of GET /api/upcoming: the stored messages of every
// vhost counted by due time.
type Upcoming struct {
	Now   string `json:"now"`
	NowMs int64  `json:"now_ms"`
	// Ranges are overdue, next_minute, next_hour, next_day, next_week and
	// later, in that order, each starting where the previous one ends.
	Ranges []UpcomingRange `json:"ranges"`
	Total  int64           `json:"total"` // the sum of the counts
}

// UpcomingRange is one range of due times of Upcoming, [from, until);
// overdue has no from, later no until.
type UpcomingRange struct {
	Name    string `json:"name"`
	From    string `json:"from,omitempty"`
	FromMs  int64  `json:"from_ms,omitempty"`
	Until   string `json:"until,omitempty"`
	UntilMs int64  `json:"until_ms,omitempty"`
	Count   int64  `json:"count"`
}

// Status is the answer of GET /api/status: what the status page shows
// besides the exchanges and the upcoming releases.
type Status struct {
	Now         string         `json:"now"`
	NowMs       int64          `json:"now_ms"`
	Version     string         `json:"version,omitempty"`
	Totals      Totals         `json:"totals"`
	Connections Connections    `json:"connections"`
	Releaser    ReleaserStatus `json:"releaser"`
	// Window is over the whole history (up to 5 minutes); null until a
	// second sample is taken, 5 s after Start.
	Window *Rates     `json:"window"`
	Series RateSeries `json:"series"`
}

// Totals are the counters since the process started, read now.
type Totals struct {
	Stored     int64 `json:"stored"`
	Released   int64 `json:"released"`
	Refused    int64 `json:"refused"`
	Discarded  int64 `json:"discarded"`
	Cancelled  int64 `json:"cancelled"`
	Unroutable int64 `json:"unroutable"`
}

// Connections are the client connections and channels open now.
type Connections struct {
	Clients  int64 `json:"clients"`
	Channels int64 `json:"channels"`
}

// ReleaserStatus is the releaser's state now.
type ReleaserStatus struct {
	// Overdue counts the messages due and not yet released, measured about
	// once a second.
	Overdue              int64   `json:"overdue"`
	OldestOverdueSeconds float64 `json:"oldest_overdue_seconds"`
	Reconnects           int64   `json:"reconnects"` // to RabbitMQ, since start
	// VHosts are the vhosts of the delayed exchanges: where releases go,
	// one connection each.
	VHosts []string `json:"vhosts"`
	// Nodes say which node releases what: this process, everything, until
	// there is a cluster mode.
	Nodes []ReleaserNode `json:"nodes"`
}

// ReleaserNode is one node of the releaser.
type ReleaserNode struct {
	Name     string `json:"name"`
	Self     bool   `json:"self"`
	Releases string `json:"releases"` // "all"
}

// Rates are what happened between two samples of the status history.
type Rates struct {
	From              string  `json:"from"`
	FromMs            int64   `json:"from_ms"`
	Until             string  `json:"until"`
	UntilMs           int64   `json:"until_ms"`
	Seconds           float64 `json:"seconds"`
	StoredPerSecond   float64 `json:"stored_per_second"`
	ReleasedPerSecond float64 `json:"released_per_second"`
	RefusedPerSecond  float64 `json:"refused_per_second"`
	// Releases is how many releases the lateness quantiles are over; they
	// are null when there were none. Estimated from the histogram's
	// buckets as Prometheus's histogram_quantile does.
	Releases    int64    `json:"releases"`
	LatenessP50 *float64 `json:"lateness_p50_seconds"`
	LatenessP99 *float64 `json:"lateness_p99_seconds"`
}

// RateSeries are the Rates of each interval between consecutive samples,
// oldest first.
type RateSeries struct {
	IntervalSeconds float64 `json:"interval_seconds"`
	Points          []Rates `json:"points"`
}
