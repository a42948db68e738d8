package testbroker

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBrokersAreTheirVersions: each broker's name is the RabbitMQ version
// its URL and its rabbitmqctl reach, so per-broker expectations hold.
func TestBrokersAreTheirVersions(t *testing.T) {
	Each(t, func(t *testing.T, b Broker) {
		amqpVersion := Dial(t, b.URL).Properties["version"]
		ctlVersion := strings.Trim(strings.TrimSpace(b.Ctl(t, "eval", "rabbit_misc:version().")), `"`)
		for _, v := range []string{fmt.Sprint(amqpVersion), ctlVersion} {
			if !strings.HasPrefix(v, b.Name+".") {
				t.Errorf("broker %s: AMQP says version %v, rabbitmqctl %s", b.Name, amqpVersion, ctlVersion)
			}
		}
	})
}

// fatalRecorder is a testing.TB whose Fatal ends only the goroutine it is
// called on, recording the message.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestUnreachableFails: a broker that does not answer fails the test (it
// never skips), naming its variable and how to start it.
func TestUnreachableFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "amqp://guest:guest@" + l.Addr().String() + "/"
	l.Close()
	tests := []struct {
		env, want string
		get       func(testing.TB)
	}{
		{"AMQP_URL", "(AMQP_URL) is not reachable (start it with `rabbitmq-server -detached`)", func(t testing.TB) { URL(t) }},
		{"AMQP_URL_43", "(AMQP_URL_43) is not reachable (start it with `bash .ci/rabbitmq43`)", func(t testing.TB) { Brokers(t) }},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv(tt.env, closed)
			r := &fatalRecorder{TB: t}
			var wg sync.WaitGroup
			wg.Go(func() { tt.get(r) })
			wg.Wait()
			if !strings.Contains(r.msg, tt.want) {
				t.Errorf("failed with %q, want it to contain %q", r.msg, tt.want)
			}
		})
	}
}
