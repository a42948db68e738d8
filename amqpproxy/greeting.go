package amqpproxy

import (
	"bytes"
	"encoding/binary"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// The greeting: the connection.start a client gets.
//
// The proxy dials RabbitMQ as soon as a client has sent its protocol
// header, before it greets the client, so every client is greeted with the
// connection.start of the RabbitMQ it is about to talk to: its server
// properties byte for byte (product, version, platform, cluster_name,
// copyright, information, capabilities, in RabbitMQ's order), with one
// key of the proxy's appended, and RabbitMQ's locales. A RabbitMQ upgraded
// behind a running proxy is what the next client sees; no properties are
// cached. The mechanisms offered are RabbitMQ's that the proxy relays.
// Only when RabbitMQ cannot be reached is the client greeted with the
// proxy's own properties (fallbackProperties), and after its start-ok
// told why with 320 CONNECTION_FORCED.

// propertyKey is the server property the proxy adds to RabbitMQ's, with
// Config.Version as its value.
const propertyKey = "delayproxy"

// relayedMechanisms are the SASL mechanisms the proxy relays, in its order
// of preference: it reads the user name from their responses (Conn.User).
var relayedMechanisms = [][]byte{[]byte("PLAIN"), []byte("AMQPLAIN")}

// serverCapabilities are the capabilities RabbitMQ 3.10 to 4.3 advertise,
// for the greeting when RabbitMQ cannot be reached.
var serverCapabilities = []string{
	"publisher_confirms", "exchange_exchange_bindings", "basic.nack",
	"consumer_cancel_notify", "connection.blocked", "consumer_priorities",
	"authentication_failure_close", "per_consumer_qos", "direct_reply_to",
}

// fallbackProperties are the server properties of a greeting without
// RabbitMQ: its capabilities and the proxy's key (when version is set).
func fallbackProperties(version string) wire.Table {
	caps := map[string]any{}
	for _, c := range serverCapabilities {
		caps[c] = true
	}
	props := map[string]any{"capabilities": caps}
	if version != "" {
		props[propertyKey] = version
	}
	t, err := wire.EncodeTable(props)
	if err != nil {
		panic(err) // strings and booleans always encode
	}
	return t
}

// greeting is the connection.start for a client whose RabbitMQ greeted the
// proxy with up (nil: RabbitMQ could not be reached).
func (srv *Server) greeting(up *wire.ConnectionStart) *wire.ConnectionStart {
	if up == nil {
		return &wire.ConnectionStart{VersionMajor: 0, VersionMinor: 9, ServerProperties: srv.fallbackProps,
			Mechanisms: bytes.Join(relayedMechanisms, []byte(" ")), Locales: []byte("en_US")}
	}
	props := up.ServerProperties
	if v := srv.cfg.Version; v != "" {
		field := binary.BigEndian.AppendUint32([]byte{'S'}, uint32(len(v)))
		if p, err := props.With(propertyKey, append(field, v...)); err == nil {
			props = p
		} // else RabbitMQ's table is malformed: relay it as it is
	}
	return &wire.ConnectionStart{VersionMajor: up.VersionMajor, VersionMinor: up.VersionMinor,
		ServerProperties: props, Mechanisms: offeredMechanisms(up.Mechanisms), Locales: up.Locales}
}

// offeredMechanisms are RabbitMQ's mechanisms that the proxy relays, in
// RabbitMQ's order; all the proxy relays when RabbitMQ offers none of them
// (RabbitMQ refuses the login then, as it would).
func offeredMechanisms(rabbit []byte) []byte {
	var out [][]byte
	for _, m := range bytes.Fields(rabbit) {
		for _, r := range relayedMechanisms {
			if bytes.Equal(m, r) {
				out = append(out, m)
			}
		}
	}
	if out == nil {
		out = relayedMechanisms
	}
	return bytes.Join(out, []byte(" "))
}
