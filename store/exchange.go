package store

// ExchangeKind says why an exchange is in the registry.
type ExchangeKind uint8

const (
	// KindDelayed is an x-delayed-message exchange declared through the
	// proxy (the plugin's API): its real exchange upstream has type
	// DelayedType, publishes to it are delayed by x-delay, and the releaser
	// declares it again when RabbitMQ has lost it.
	KindDelayed ExchangeKind = iota
	// KindDeliveryTime is an ordinary exchange (the default exchange ""
	// included) registered by the first publish to it that asked for a
	// delay with x-opt-delivery-time or x-opt-delivery-delay (RabbitMQ
	// 4.4's API). Its DelayedType is "": the proxy never declares it, and
	// a release to it that RabbitMQ refuses because it no longer exists is
	// dropped after bounded attempts.
	KindDeliveryTime
)

// ExchangeDef is an exchange as recorded in the registry: a delayed
// exchange, or an exchange that holds delivery-time messages (Kind).
type ExchangeDef struct {
	VHost       string
	Name        string
	Kind        ExchangeKind
	DelayedType string // x-delayed-type: direct, topic, fanout, headers, ...; "" for KindDeliveryTime
	Durable     bool
	AutoDelete  bool
	Internal    bool
	Arguments   []byte // raw AMQP field table as declared (x-delayed-type included)
	Incarnation uint64 // assigned by PutExchange; a re-created exchange gets a new one
}

// ExchangeCount is the number of pending messages of one delayed exchange.
type ExchangeCount struct {
	VHost    string
	Exchange string
	Pending  int64
	// NextDue is the unix ms of the earliest pending message; 0 when none is
	// pending or when it lies beyond the bounded scan of Counts.
	NextDue int64
}
