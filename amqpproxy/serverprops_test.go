package amqpproxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testserver"
)

// startOf sends the protocol header to addr and returns the
// connection.start that answers it.
func startOf(t *testing.T, addr string) *wire.ConnectionStart {
	t.Helper()
	c := rawDial(t, addr)
	c.raw(wire.ProtocolHeader[:])
	return c.expect(0, wire.IDConnectionStart).(*wire.ConnectionStart)
}

// propsEntry is the encoding of a table entry name => longstr value.
func propsEntry(name, value string) []byte {
	b := append([]byte{byte(len(name))}, name...)
	b = append(b, 'S', byte(len(value)>>24), byte(len(value)>>16), byte(len(value)>>8), byte(len(value)))
	return append(b, value...)
}

// TestServerPropertiesAreRabbitMQs: the connection.start a client gets from
// the proxy carries RabbitMQ's own server properties, byte for byte
// (product, version, platform, cluster_name, copyright, information and the
// capabilities, in RabbitMQ's order), with one key added at the end:
// "delayproxy" => Config.Version. The protocol version and locales are
// RabbitMQ's; the mechanisms are RabbitMQ's that the proxy relays (PLAIN,
// AMQPLAIN), in RabbitMQ's order. On RabbitMQ 3.10 and 4.3.
func TestServerPropertiesAreRabbitMQs(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		direct := startOf(t, b.Addr(t))
		p := startProxyOn(t, b, Config{Version: "delayproxy 1.2.3 (test)"})
		got := startOf(t, p.addr)
		want := append(bytes.Clone(direct.ServerProperties), propsEntry("delayproxy", "delayproxy 1.2.3 (test)")...)
		if !bytes.Equal(got.ServerProperties, want) {
			t.Fatalf("server properties through the proxy:\n%x\nRabbitMQ's plus the proxy's key:\n%x", got.ServerProperties, want)
		}
		if got.VersionMajor != direct.VersionMajor || got.VersionMinor != direct.VersionMinor || !bytes.Equal(got.Locales, direct.Locales) {
			t.Fatalf("version %d-%d locales %q through the proxy, RabbitMQ's %d-%d %q",
				got.VersionMajor, got.VersionMinor, got.Locales, direct.VersionMajor, direct.VersionMinor, direct.Locales)
		}
		var relayable [][]byte
		for _, m := range bytes.Fields(direct.Mechanisms) {
			if string(m) == "PLAIN" || string(m) == "AMQPLAIN" {
				relayable = append(relayable, m)
			}
		}
		if want := bytes.Join(relayable, []byte(" ")); !bytes.Equal(got.Mechanisms, want) {
			t.Fatalf("mechanisms %q through the proxy, want %q (RabbitMQ offers %q)", got.Mechanisms, want, direct.Mechanisms)
		}
		prop := func(k string) any { v, _, _ := direct.ServerProperties.Get(k); return v }
		t.Logf("RabbitMQ %s: product %v version %v platform %v cluster_name %v; mechanisms %q -> %q",
			b.Name, prop("product"), prop("version"), prop("platform"), prop("cluster_name"), direct.Mechanisms, got.Mechanisms)
	})
}

// TestServerPropertiesAmqplib: amqplib's own suite asserts product
// "RabbitMQ"; through the proxy it holds, and amqplib reads RabbitMQ's
// version and capabilities.
func TestServerPropertiesAmqplib(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		direct := startOf(t, b.Addr(t)).ServerProperties
		version, _, err := direct.Get("version")
		if err != nil {
			t.Fatal(err)
		}
		p := startProxyOn(t, b, Config{Version: "test"})
		out, err := runNode(t, "amqplib_props.js", p.url(t))
		if err != nil {
			t.Fatalf("amqplib through the proxy: %v\n%s", err, out)
		}
		var got struct {
			Product, Version, Delayproxy string
			Capabilities                 map[string]bool
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		rawCaps, _, _ := direct.Get("capabilities")
		caps, _ := rawCaps.(wire.Table)
		if got.Version != version || got.Delayproxy != "test" {
			t.Fatalf("amqplib read %+v; RabbitMQ's version %v", got, version)
		}
		for _, c := range []string{"publisher_confirms", "basic.nack", "consumer_cancel_notify", "exchange_exchange_bindings",
			"connection.blocked", "authentication_failure_close", "per_consumer_qos", "consumer_priorities", "direct_reply_to"} {
			if want, _, err := caps.Get(c); err != nil || got.Capabilities[c] != (want == true) {
				t.Fatalf("amqplib reads capability %s = %v, RabbitMQ advertises %v (%v)", c, got.Capabilities[c], want, err)
			}
		}
	})
}

// TestServerPropertiesFollowAnUpgrade: a running proxy whose RabbitMQ is
// replaced by another version (here: its upstream address moves from 3.10
// to 4.3) greets the next client with the new RabbitMQ's properties.
func TestServerPropertiesFollowAnUpgrade(t *testing.T) {
	t.Parallel()
	brokers := testbroker.Brokers(t)
	sw := startSwitch(t, brokers[0].Addr(t))
	p := startProxy(t, Config{Upstream: "amqp://" + sw.l.Addr().String()})
	for _, b := range brokers {
		addr := b.Addr(t)
		sw.target.Store(&addr)
		want, _, _ := startOf(t, addr).ServerProperties.Get("version")
		got, _, _ := startOf(t, p.addr).ServerProperties.Get("version")
		if got != want {
			t.Fatalf("behind RabbitMQ %s the proxy advertises version %v, want %v", b.Name, got, want)
		}
	}
}

// When RabbitMQ cannot be reached the client is greeted all the same (with
// the proxy's own properties), and told why after its start-ok:
// TestUpstreamUnreachable.

// upstreamSwitch forwards TCP connections to whatever target holds when
// they are accepted.
type upstreamSwitch struct {
	l      net.Listener
	target atomic.Pointer[string]
}

func startSwitch(t *testing.T, target string) *upstreamSwitch {
	sw := &upstreamSwitch{l: testserver.Listen(t)}
	sw.target.Store(&target)
	var wg sync.WaitGroup
	var mu sync.Mutex // guards conns
	conns := map[net.Conn]bool{}
	track := func(c net.Conn) {
		mu.Lock()
		conns[c] = true
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			c, err := sw.l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", *sw.target.Load())
			if err != nil {
				c.Close()
				continue
			}
			track(c)
			track(up)
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				wg.Go(func() {
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				})
			}
		}
	})
	t.Cleanup(func() {
		sw.l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return sw
}
