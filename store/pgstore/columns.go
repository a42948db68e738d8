package pgstore

import "github.com/delayproxy/delayproxy/store"

// messageColumns are messages as the arrays one INSERT ... SELECT FROM
// unnest(...) stores them with: one statement for a whole group commit.
type messageColumns struct {
	k, properties, body            [][]byte
	incarnation, delay             []int64
	vhost, exchange, rk, messageID []string
	mandatory                      []bool
	priority                       []int16
}

func newMessageColumns(n int) *messageColumns {
	return &messageColumns{
		k: make([][]byte, 0, n), properties: make([][]byte, 0, n), body: make([][]byte, 0, n),
		incarnation: make([]int64, 0, n), delay: make([]int64, 0, n),
		vhost: make([]string, 0, n), exchange: make([]string, 0, n), rk: make([]string, 0, n), messageID: make([]string, 0, n),
		mandatory: make([]bool, 0, n), priority: make([]int16, 0, n),
	}
}

// add appends m, whose Key is set.
func (c *messageColumns) add(m *store.Message) {
	c.k = append(c.k, m.Key[:])
	c.incarnation = append(c.incarnation, int64(m.Incarnation))
	c.vhost = append(c.vhost, m.VHost)
	c.exchange = append(c.exchange, m.Exchange)
	c.rk = append(c.rk, m.RoutingKey)
	c.mandatory = append(c.mandatory, m.Mandatory)
	c.properties = append(c.properties, nonNil(m.Properties))
	c.body = append(c.body, nonNil(m.Body))
	c.delay = append(c.delay, m.Delay)
	c.priority = append(c.priority, int16(m.Priority))
	c.messageID = append(c.messageID, m.MessageID)
}

// args are the INSERT's parameters $1..$11.
func (c *messageColumns) args() []any {
	return []any{c.k, c.incarnation, c.vhost, c.exchange, c.rk, c.mandatory, c.properties, c.body, c.delay, c.priority, c.messageID}
}

// nonNil is b, or an empty slice for nil: a NULL would not fit the NOT
// NULL columns.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
