package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// lockedBuffer is a bytes.Buffer safe for one writer (the log handler) and
// readers.
type lockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logRecord is one JSON log line.
type logRecord map[string]any

func (r logRecord) str(k string) string { s, _ := r[k].(string); return s }

// TestService_ConnectionLog: a client connection gives one line at info
// level when it opens ("client connection opened") and one when it closes
// ("client connection closed"), each with the client address,
// user and vhost, the close line with a reason (the client's own close, and
// the proxy's shutdown); neither the password nor a message body appears
// anywhere in the log, at debug level, including for a refused login.
func TestService_ConnectionLog(t *testing.T) {
	t.Parallel()
	user := "dp-e2e-log-" + randHex(t, 4)
	password := "pw-" + randHex(t, 12)
	wrongPassword := "wrong-" + randHex(t, 12)
	body := "body-" + randHex(t, 12)
	testbroker.AddUser(t, user, password)
	testbroker.Ctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")

	logs := &lockedBuffer{}
	tp := startProxyWith(t, nil, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	proxyURL := func(pass string) string {
		return withUser(t, tp.URL(), user, pass)
	}

	// A refused login.
	if c, err := amqp.Dial(proxyURL(wrongPassword)); err == nil {
		c.Close()
		t.Fatal("a wrong password was accepted")
	} else if !errorIs(err, amqp.AccessRefused, "") {
		t.Errorf("wrong password: %v, want 403", err)
	}

	// A client that publishes a delayed message and a relayed one, then
	// closes; another left open until the proxy shuts down.
	conn := testbroker.Dial(t, proxyURL(password))
	connAddr := conn.LocalAddr().String()
	ch := confirmChannel(t, conn)
	ex, q := delayedQueue(t, ch, "fanout", "")
	msg := delayedMsg(300, "logged")
	msg.Body = []byte(body)
	publishConfirmed(t, ch, ex, "", false, msg)
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Body: []byte(body)})
	testwait.Until(t, 20*time.Second, "the delayed message to arrive", func() bool { return queueDepth(t, q) == 2 })
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	open := testbroker.Dial(t, proxyURL(password))
	openAddr := open.LocalAddr().String()
	closed := open.NotifyClose(make(chan *amqp.Error, 1))
	// Shut down only once the proxy relays for this client: one that has
	// its open-ok but is not relaying yet is dropped without a 320 (see
	// the report on amqpproxy's session.shutdown).
	testwait.Until(t, 10*time.Second, "the second connection's open line", func() bool {
		return strings.Contains(logs.String(), `"client":"`+openAddr+`"`)
	})
	tp.stop()
	if e := testbroker.AwaitClose(t, closed, 15*time.Second); e.Code != amqp.ConnectionForced {
		t.Errorf("connection open at shutdown closed with %d %s, want 320", e.Code, e.Reason)
	}

	text := logs.String()
	defer func() {
		if t.Failed() {
			t.Logf("log:\n%s", text)
		}
	}()
	for what, secret := range map[string]string{
		"password": password, "wrong password": wrongPassword,
		"body": body, "base64 body": base64.StdEncoding.EncodeToString([]byte(body)),
	} {
		if strings.Contains(text, secret) {
			t.Errorf("the log holds the %s %q", what, secret)
		}
	}

	var recs []logRecord
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r logRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	// Lines at info or above naming a client address, by address.
	byClient := map[string][]logRecord{}
	for _, r := range recs {
		if r.str("level") == "DEBUG" {
			continue
		}
		if a := r.str("client"); a != "" {
			byClient[a] = append(byClient[a], r)
		}
	}
	for _, c := range []struct {
		addr, closeReason string
	}{
		{connAddr, "client"}, // the client's own connection.close
		{openAddr, "shut"},   // closed by the proxy's shutdown
	} {
		var opened, closedRecs []logRecord
		for _, r := range byClient[c.addr] {
			switch r.str("msg") {
			case "client connection opened":
				opened = append(opened, r)
			case "client connection closed":
				closedRecs = append(closedRecs, r)
			}
		}
		if len(opened) != 1 || len(closedRecs) != 1 {
			t.Errorf("client %s: %d \"client connection opened\" and %d \"client connection closed\" lines at info, want 1 and 1; its lines: %v", c.addr, len(opened), len(closedRecs), byClient[c.addr])
			continue
		}
		for _, r := range []logRecord{opened[0], closedRecs[0]} {
			if r.str("user") != user || r.str("vhost") != "/" {
				t.Errorf("client %s: line %q has user %q vhost %q, want %q and /", c.addr, r.str("msg"), r.str("user"), r.str("vhost"), user)
			}
		}
		if reason := strings.ToLower(closedRecs[0].str("reason")); !strings.Contains(reason, c.closeReason) {
			t.Errorf("client %s: close line %v: reason %q, want one mentioning %q", c.addr, closedRecs[0], reason, c.closeReason)
		}
	}
}
