package store

// Message is one delayed message as stored.
type Message struct {
	Key         Key    // assigned by Put from Due, Priority and a new sequence
	VHost       string // virtual host of the delayed exchange
	Exchange    string // name of the delayed exchange
	RoutingKey  string
	Mandatory   bool
	Properties  []byte // raw content-header property flags and list, byte-exact
	Body        []byte
	Due         int64  // unix milliseconds at which to release
	Delay       int64  // the x-delay asked for, ms (the release sets x-delay = -Delay); 0 for a delivery-time message, released with its properties unchanged
	Priority    uint8  // AMQP priority property, 0 when absent
	MessageID   string // AMQP message-id property, "" when absent
	Incarnation uint64 // registry incarnation of the exchange, from its ExchangeDef; set by the caller of Put
}
