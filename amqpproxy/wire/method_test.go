package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// fill sets every field of the method struct m points to from rng, the way a
// real peer could: shortstrs up to 255 bytes, empty longstrs and tables nil.
func fill(t testing.TB, rng *rand.Rand, m Method) {
	t.Helper()
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Interface().(type) {
		case bool:
			f.SetBool(rng.IntN(2) == 1)
		case uint8, uint16, uint32, uint64:
			f.SetUint(rng.Uint64())
		case string:
			f.SetString(randString(rng, rng.IntN(3)*rng.IntN(128)))
		case []byte:
			if n := rng.IntN(3) * rng.IntN(64); n > 0 {
				b := make([]byte, n)
				for j := range b {
					b[j] = byte(rng.Uint32())
				}
				f.SetBytes(b)
			}
		case Table:
			if rng.IntN(3) > 0 {
				tb, err := EncodeTable(map[string]any{"k": randString(rng, 5), "n": rng.Int64(), "nested": map[string]any{"b": true}})
				if err != nil {
					t.Fatal(err)
				}
				f.Set(reflect.ValueOf(tb))
			}
		default:
			t.Fatalf("%T: field %s of unhandled type %s", m, v.Type().Field(i).Name, f.Type())
		}
	}
}

func randString(rng *rand.Rand, n int) string {
	const chars = "abcdefghijklmnopqrstuvwxyz.-_:0123456789é"
	var b strings.Builder
	for b.Len() < n {
		b.WriteByte(chars[rng.IntN(len(chars)-2)])
	}
	return b.String()
}

func TestMethodRoundTripEveryMethod(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, id := range allMethodIDs {
		t.Run(id.String(), func(t *testing.T) {
			for range 50 {
				m := newMethod(id)
				if m.ID() != id {
					t.Fatalf("newMethod(%v).ID() = %v", id, m.ID())
				}
				fill(t, rng, m)
				payload := AppendMethod(nil, m)
				if got, err := PeekMethodID(payload); err != nil || got != id {
					t.Fatalf("PeekMethodID = %v, %v", got, err)
				}
				got, err := DecodeMethod(payload)
				if err != nil {
					t.Fatalf("DecodeMethod(%x): %v", payload, err)
				}
				if !reflect.DeepEqual(got, m) {
					t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
				}
				if again := AppendMethod(nil, got); !bytes.Equal(again, payload) {
					t.Fatalf("re-encode differs:\n%x\n%x", again, payload)
				}
				// Every strict prefix is truncated; any extra byte is trailing.
				for n := 4; n < len(payload); n++ {
					_, err := DecodeMethod(payload[:n])
					assertCode(t, err, FrameError, ErrShort)
				}
				_, err = DecodeMethod(append(payload, 0))
				assertCode(t, err, FrameError, ErrTrailing)
			}
		})
	}
}

func assertCode(t testing.TB, err error, code uint16, sentinel error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	if e.Code != code {
		t.Fatalf("error %v: code %d, want %d", err, e.Code, code)
	}
	if sentinel != nil && !errors.Is(err, sentinel) {
		t.Fatalf("error %v does not wrap %v", err, sentinel)
	}
}

// TestMethodWireBytes pins encodings written out by hand from the spec.
func TestMethodWireBytes(t *testing.T) {
	args, err := EncodeTable(map[string]any{"x-delayed-type": "direct"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		m   Method
		hex string
	}{
		{&BasicPublish{Exchange: "ex", RoutingKey: "rk", Mandatory: true},
			"003c0028" + "0000" + "026578" + "02726b" + "01"},
		{&BasicPublish{Immediate: true}, "003c0028" + "0000" + "00" + "00" + "02"},
		{&ExchangeDeclare{Exchange: "d", Type: "x-delayed-message", Durable: true, NoWait: true, Arguments: args},
			"0028000a" + "0000" + "0164" + "11782d64656c617965642d6d657373616765" + "12" +
				"0000001a" + "0e782d64656c617965642d74797065" + "53" + "00000006" + "646972656374"},
		{&ConnectionClose{ReplyCode: 320, ReplyText: "bye", ClassID: 60, MethodID: 40},
			"000a0032" + "0140" + "03627965" + "003c" + "0028"},
		{&BasicAck{DeliveryTag: 1 << 40, Multiple: true}, "003c0050" + "0000010000000000" + "01"},
		{&BasicNack{DeliveryTag: 7, Requeue: true}, "003c0078" + "0000000000000007" + "02"},
		{&QueueDeclareOk{Queue: "q", MessageCount: 2, ConsumerCount: 3}, "0032000b" + "0171" + "00000002" + "00000003"},
		{&ConnectionStartOk{Mechanism: "PLAIN", Response: []byte("\x00g\x00g"), Locale: "en_US"},
			"000a000b" + "00000000" + "05504c41494e" + "00000004" + "00670067" + "05656e5f5553"},
		{&ChannelOpenOk{}, "0014000b" + "00000000"},
		{&TxCommitOk{}, "005a0015"},
		{&ConfirmSelect{NoWait: true}, "0055000a" + "01"},
		{&ConnectionTune{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 60}, "000a001e" + "07ff" + "00020000" + "003c"},
	}
	for _, tt := range tests {
		want := tt.hex
		got := hex.EncodeToString(AppendMethod(nil, tt.m))
		if got != want {
			t.Errorf("%v:\n got %s\nwant %s", tt.m.ID(), got, want)
			continue
		}
		raw, _ := hex.DecodeString(want)
		m, err := DecodeMethod(raw)
		if err != nil || !reflect.DeepEqual(m, tt.m) {
			t.Errorf("%v: decode = %#v, %v", tt.m.ID(), m, err)
		}
	}
}

func TestDecodeMethodErrors(t *testing.T) {
	tests := []struct {
		name     string
		payload  []byte
		code     uint16
		sentinel error
	}{
		{"empty", nil, FrameError, ErrShort},
		{"two bytes", []byte{0, 60}, FrameError, ErrShort},
		{"unknown method", []byte{0, 60, 3, 231}, CommandInvalid, ErrUnknownMethod},
		{"unknown class", []byte{0, 99, 0, 10}, CommandInvalid, ErrUnknownMethod},
		{"qos truncated", []byte{0, 60, 0, 10, 0, 0, 0}, FrameError, ErrShort},
		{"qos missing bits", []byte{0, 60, 0, 10, 0, 0, 0, 0, 0, 1}, FrameError, ErrShort},
		{"qos trailing", []byte{0, 60, 0, 10, 0, 0, 0, 0, 0, 1, 0, 7}, FrameError, ErrTrailing},
		{"close-ok trailing", []byte{0, 10, 0, 51, 0}, FrameError, ErrTrailing},
		{"declare table overrun", append([]byte{0, 40, 0, 10, 0, 0, 1, 'x', 1, 'd', 0}, 0, 0, 0, 50), FrameError, ErrShort},
		{"declare bad field type", append([]byte{0, 40, 0, 10, 0, 0, 1, 'x', 1, 'd', 0}, 0, 0, 0, 3, 1, 'k', 'Z'), FrameError, ErrFieldType},
		{"longstr of 4 GiB", []byte{0, 10, 0, 21, 0xff, 0xff, 0xff, 0xff, 1}, FrameError, ErrShort},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := DecodeMethod(tt.payload)
			if m != nil {
				t.Fatalf("got a method %#v with error %v", m, err)
			}
			assertCode(t, err, tt.code, tt.sentinel)
			var e *Error
			errors.As(err, &e)
			if len(tt.payload) >= 4 && (e.ClassID != uint16(tt.payload[0])<<8|uint16(tt.payload[1]) || e.MethodID != uint16(tt.payload[2])<<8|uint16(tt.payload[3])) {
				t.Fatalf("error names %d.%d, want the method of %x", e.ClassID, e.MethodID, tt.payload[:4])
			}
		})
	}
}

// TestDecodeIgnoresUnusedBits: RabbitMQ accepts set bits beyond a method's
// last bit field (basic.qos with flags 0xff succeeds), and so do we.
func TestDecodeIgnoresUnusedBits(t *testing.T) {
	m, err := DecodeMethod([]byte{0, 60, 0, 10, 0, 0, 0, 0, 0, 1, 0xff})
	if err != nil {
		t.Fatal(err)
	}
	if q := m.(*BasicQos); !q.Global || q.PrefetchCount != 1 {
		t.Fatalf("%+v", q)
	}
}

func TestAppendLongShortstr(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	m := &ConnectionClose{ReplyCode: 541, ReplyText: long}
	got, err := DecodeMethod(AppendMethod(nil, m))
	if err != nil {
		t.Fatal(err)
	}
	text := got.(*ConnectionClose).ReplyText
	if len(text) != 254 || text != long[:254] {
		t.Fatalf("truncated to %d bytes %q, want 254 on a rune boundary", len(text), text)
	}
	ascii := strings.Repeat("a", 300)
	got, _ = DecodeMethod(AppendMethod(nil, &BasicPublish{RoutingKey: ascii}))
	if rk := got.(*BasicPublish).RoutingKey; rk != ascii[:255] {
		t.Fatalf("routing key cut to %d bytes, want 255", len(rk))
	}
}

func TestMethodIDMetadata(t *testing.T) {
	if IDBasicPublish.Class() != 60 || IDBasicPublish.Method() != 40 || MethodID(60<<16|40) != IDBasicPublish {
		t.Fatal("class/method split")
	}
	for id, name := range map[MethodID]string{
		IDBasicPublish: "basic.publish", IDExchangeDeclareOk: "exchange.declare-ok",
		IDConfirmSelect: "confirm.select", IDTxCommitOk: "tx.commit-ok",
		IDConnectionUpdateSecretOk: "connection.update-secret-ok", MethodID(60<<16 | 999): "method(60.999)",
	} {
		if id.String() != name {
			t.Errorf("%d: String() = %q, want %q", uint32(id), id.String(), name)
		}
	}
	seen := map[MethodID]bool{}
	content := 0
	for _, id := range allMethodIDs {
		if seen[id] || !id.Known() {
			t.Fatalf("%v duplicate or unknown", id)
		}
		seen[id] = true
		if HasContent(id) {
			content++
		}
		for _, r := range ResponsesOf(id) {
			if req, ok := RequestOf(r); !ok || req != id {
				t.Errorf("RequestOf(%v) = %v, %v; want %v", r, req, ok, id)
			}
		}
	}
	if len(seen) != 64 {
		t.Errorf("%d methods, want 64 (0-9-1 plus RabbitMQ's extensions)", len(seen))
	}
	if content != 4 || !HasContent(IDBasicPublish) || !HasContent(IDBasicReturn) || !HasContent(IDBasicDeliver) || !HasContent(IDBasicGetOk) {
		t.Errorf("HasContent wrong: %d methods", content)
	}
	responses := map[MethodID][]MethodID{
		IDBasicGet:        {IDBasicGetOk, IDBasicGetEmpty},
		IDBasicRecover:    {IDBasicRecoverOk},
		IDConfirmSelect:   {IDConfirmSelectOk},
		IDExchangeUnbind:  {IDExchangeUnbindOk},
		IDChannelClose:    {IDChannelCloseOk},
		IDBasicPublish:    nil,
		IDBasicAck:        nil,
		IDChannelFlowOk:   nil,
		IDExchangeBindOk:  nil,
		IDConnectionStart: {IDConnectionStartOk},
	}
	for id, want := range responses {
		if got := ResponsesOf(id); !reflect.DeepEqual(got, want) {
			t.Errorf("ResponsesOf(%v) = %v, want %v", id, got, want)
		}
		if IsSynchronousRequest(id) != (want != nil) {
			t.Errorf("IsSynchronousRequest(%v) = %v", id, !(want != nil))
		}
	}
	if _, ok := RequestOf(IDBasicPublish); ok {
		t.Error("basic.publish is not a response")
	}
}

func TestGeneratedFileIsCurrent(t *testing.T) {
	dir := t.TempDir()
	out := dir + "/methods_gen.go"
	cmd := exec.Command("go", "run", "./internal/gen", "-o", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./internal/gen: %v\n%s", err, msg)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("methods_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("methods_gen.go is stale: run go generate ./amqpproxy/wire")
	}
}

func TestErrorCloseMethod(t *testing.T) {
	_, err := DecodeMethod([]byte{0, 60, 0, 10, 0, 0, 0})
	var e *Error
	if !errors.As(err, &e) {
		t.Fatal(err)
	}
	c, ok := e.CloseMethod().(*ConnectionClose)
	if !ok || c.ReplyCode != FrameError || c.ClassID != 60 || c.MethodID != 10 ||
		c.ReplyText != "FRAME_ERROR - cannot decode basic.qos: truncated field" {
		t.Fatalf("%+v", e.CloseMethod())
	}
	soft := &Error{Code: NotFound, Text: "no queue 'q'", ClassID: 50, MethodID: 10}
	if ch, ok := soft.CloseMethod().(*ChannelClose); !ok || ch.ReplyText != "NOT_FOUND - no queue 'q'" || ch.ClassID != 50 {
		t.Fatalf("%+v", soft.CloseMethod())
	}
}
