package delayed

import (
	"errors"
	"testing"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

func TestRealDeclare(t *testing.T) {
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		wantCode uint16
		wantText string
	}{
		{name: "direct", args: map[string]any{"x-delayed-type": "direct"}, wantType: "direct"},
		{name: "topic", args: map[string]any{"x-delayed-type": "topic", "alternate-exchange": "ae"}, wantType: "topic"},
		{name: "fanout", args: map[string]any{"x-delayed-type": "fanout"}, wantType: "fanout"},
		{name: "headers", args: map[string]any{"x-delayed-type": "headers"}, wantType: "headers"},
		{name: "bytes type", args: map[string]any{"x-delayed-type": []byte("direct")}, wantType: "direct"},
		{name: "unknown type is RabbitMQ's to refuse", args: map[string]any{"x-delayed-type": "x-nope"}, wantType: "x-nope"},
		{name: "missing", args: nil, wantCode: wire.PreconditionFailed,
			wantText: "Invalid argument, 'x-delayed-type' must be an existing exchange type"},
		{name: "not a string", args: map[string]any{"x-delayed-type": int32(1)}, wantCode: wire.PreconditionFailed,
			wantText: "Invalid argument, 'x-delayed-type' must be an existing exchange type"},
		{name: "empty", args: map[string]any{"x-delayed-type": ""}, wantCode: wire.PreconditionFailed,
			wantText: "Invalid argument, 'x-delayed-type' must be an existing exchange type"},
		{name: "itself", args: map[string]any{"x-delayed-type": "x-delayed-message"}, wantCode: wire.PreconditionFailed,
			wantText: "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &wire.ExchangeDeclare{Exchange: "ex", Type: TypeDelayed, Durable: true, NoWait: true}
			if tt.args != nil {
				var err error
				if m.Arguments, err = wire.EncodeTable(tt.args); err != nil {
					t.Fatal(err)
				}
			}
			up, err := realDeclare(m)
			if tt.wantCode != 0 {
				var we *wire.Error
				if !errors.As(err, &we) || we.Code != tt.wantCode || we.Text != tt.wantText {
					t.Fatalf("err = %v, want %d %q", err, tt.wantCode, tt.wantText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if up.Type != tt.wantType || up.NoWait || !up.Durable || string(up.Arguments) != string(m.Arguments) {
				t.Fatalf("real declare = %+v", up)
			}
			def := registryDef("/v", &up)
			if def.DelayedType != tt.wantType || def.Name != "ex" || def.VHost != "/v" || !def.Durable {
				t.Fatalf("def = %+v", def)
			}
		})
	}
}
