package store

// ExchangeDef is a delayed exchange as recorded in the registry.
type ExchangeDef struct {
	VHost       string
	Name        string
	DelayedType string // x-delayed-type: direct, topic, fanout, headers, ...
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
