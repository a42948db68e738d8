package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "write the frames captured from amqp091-go and RabbitMQ to testdata/fuzz")

// writeCorpus adds captured frames (raw, as on the wire) to the fuzz seed
// corpora under testdata/fuzz when -update-corpus is set:
//
//	go test ./amqpproxy/wire -run 'Amqp091|Broker' -update-corpus
func writeCorpus(t *testing.T, source string, frames [][]byte) {
	if !*updateCorpus {
		return
	}
	t.Helper()
	add := func(target string, args ...[]byte) {
		var b bytes.Buffer
		b.WriteString("go test fuzz v1\n")
		for _, a := range args {
			fmt.Fprintf(&b, "[]byte(%q)\n", a)
		}
		sum := sha256.Sum256(b.Bytes())
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, source+"-"+hex.EncodeToString(sum[:8]))
		if err := os.WriteFile(name, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stream []byte
	for _, raw := range frames {
		f, err := NewReader(bytes.NewReader(raw), 0).ReadFrame()
		if err != nil {
			t.Fatalf("captured frame %x: %v", raw, err)
		}
		if f.Type == FrameBody && len(f.Payload) > 256 {
			continue // big bodies only slow the fuzzer down
		}
		stream = append(stream, raw...)
		switch f.Type {
		case FrameMethod:
			add("FuzzDecodeMethod", f.Payload)
			m, err := DecodeMethod(f.Payload)
			if err != nil {
				t.Fatal(err)
			}
			for _, tb := range tablesOf(m) {
				add("FuzzTable", tb)
			}
		case FrameHeader:
			add("FuzzContentHeader", f.Payload)
			h, err := DecodeContentHeader(f.Payload)
			if err != nil {
				t.Fatal(err)
			}
			add("FuzzProperties", h.Properties)
			if p, err := DecodeProperties(h.Properties); err == nil && len(p.Headers) > 0 {
				add("FuzzTable", p.Headers)
			}
		}
	}
	add("FuzzReadFrame", []byte{0}, stream)
	add("FuzzReadFrame", []byte{5, 0, 17, 2}, stream)
}

// tablesOf returns the non-empty Table fields of a method.
func tablesOf(m Method) []Table {
	var out []Table
	switch m := m.(type) {
	case *ConnectionStart:
		out = append(out, m.ServerProperties)
	case *ConnectionStartOk:
		out = append(out, m.ClientProperties)
	case *ExchangeDeclare:
		out = append(out, m.Arguments)
	case *QueueDeclare:
		out = append(out, m.Arguments)
	case *QueueBind:
		out = append(out, m.Arguments)
	}
	var nonEmpty []Table
	for _, t := range out {
		if len(t) > 0 {
			nonEmpty = append(nonEmpty, t)
		}
	}
	return nonEmpty
}
