package amqpproxy

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// url43Default is RabbitMQ 4.3 as .ci/rabbitmq43 runs it, when AMQP_URL_43
// is not set.
const url43Default = "amqp://guest:guest@127.0.0.1:5682/"

// testUpstream is one of the real brokers a test runs against.
type testUpstream struct {
	name string // "3.10", "4.3"
	url  string // amqp://guest:guest@host:port/
	addr string // host:port
}

// upstreams are the brokers of the wire tests: RabbitMQ 3.10 (AMQP_URL) and
// 4.3 (AMQP_URL_43, started by `bash .ci/rabbitmq43`). A broker that does
// not answer fails the test.
func upstreams(t testing.TB) []testUpstream {
	t.Helper()
	u43 := os.Getenv("AMQP_URL_43")
	if u43 == "" {
		u43 = url43Default
	}
	out := []testUpstream{{name: "3.10", url: testbroker.URL(t)}, {name: "4.3", url: u43}}
	for i := range out {
		pu, err := url.Parse(out[i].url)
		if err != nil {
			t.Fatalf("broker %s: %v", out[i].name, err)
		}
		out[i].addr = pu.Host
		if pu.Port() == "" {
			out[i].addr = net.JoinHostPort(pu.Hostname(), "5672")
		}
		c, err := net.DialTimeout("tcp", out[i].addr, 5*time.Second)
		if err != nil {
			t.Fatalf("RabbitMQ %s at %s is not reachable (bash .ci/rabbitmq43 starts 4.3): %v", out[i].name, out[i].addr, err)
		}
		c.Close()
	}
	return out
}

// proxyURL is the proxy's address with the broker's credentials and vhost.
func (u testUpstream) proxyURL(t testing.TB, p *testProxy) string {
	t.Helper()
	pu, err := url.Parse(u.url)
	if err != nil {
		t.Fatal(err)
	}
	pu.Host = p.addr
	return pu.String()
}
