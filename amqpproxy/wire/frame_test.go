package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
)

// chunkReader returns at most the next size of sizes bytes per Read, cycling,
// to split frames at arbitrary points.
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if len(r.sizes) > 0 {
		n = min(n, int(r.sizes[r.i%len(r.sizes)])+1)
		r.i++
	}
	n = copy(p, r.data[:min(n, len(r.data))])
	r.data = r.data[n:]
	return n, nil
}

func TestReadFrameStream(t *testing.T) {
	frames := []Frame{
		{Type: FrameMethod, Channel: 1, Payload: AppendMethod(nil, &BasicPublish{Exchange: "x", RoutingKey: "k"})},
		{Type: FrameHeader, Channel: 1, Payload: AppendContentHeader(nil, ContentHeader{ClassID: 60, BodySize: 3})},
		{Type: FrameBody, Channel: 1, Payload: []byte("abc")},
		{Type: FrameHeartbeat},
		{Type: FrameBody, Channel: 65535, Payload: bytes.Repeat([]byte{7}, 70000)},
	}
	var stream []byte
	for _, f := range frames {
		stream = AppendFrame(stream, f)
	}
	for _, sizes := range [][]byte{nil, {0}, {2, 0, 6, 200}} {
		r := NewReader(&chunkReader{data: stream, sizes: sizes}, 0)
		for i, want := range frames {
			got, err := r.ReadFrame()
			if err != nil {
				t.Fatalf("sizes %v frame %d: %v", sizes, i, err)
			}
			if got.Type != want.Type || got.Channel != want.Channel || !bytes.Equal(got.Payload, want.Payload) {
				t.Fatalf("sizes %v frame %d: got %d/%d/%d bytes", sizes, i, got.Type, got.Channel, len(got.Payload))
			}
		}
		if _, err := r.ReadFrame(); err != io.EOF {
			t.Fatalf("after the last frame: %v, want io.EOF", err)
		}
	}
	// Writer and AppendFrame agree.
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, f := range frames {
		if err := w.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil || !bytes.Equal(buf.Bytes(), stream) {
		t.Fatalf("Writer output differs from AppendFrame: %v", err)
	}
}

// TestReaderHasFrame: after a frame is read, HasFrame says whether the
// bytes already buffered hold the whole next one.
func TestReaderHasFrame(t *testing.T) {
	first := AppendFrame(nil, Frame{Type: FrameMethod, Channel: 1, Payload: []byte{0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 1, 0}})
	next := AppendFrame(nil, Frame{Type: FrameBody, Channel: 1, Payload: []byte("abc")})
	tests := []struct {
		name string
		rest []byte
		want bool
	}{
		{"nothing", nil, false},
		{"part of a header", next[:3], false},
		{"a header", next[:FrameHeaderSize], false},
		{"all but the frame-end", next[:len(next)-1], false},
		{"a whole frame", next, true},
		{"a whole heartbeat", AppendFrame(nil, Frame{Type: FrameHeartbeat}), true},
		{"a whole frame and more", append(slices.Clone(next), next[:5]...), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(append(slices.Clone(first), tt.rest...)), 0)
			if _, err := r.ReadFrame(); err != nil {
				t.Fatal(err)
			}
			if got := r.HasFrame(); got != tt.want {
				t.Fatalf("HasFrame = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	method := AppendFrame(nil, Frame{Type: FrameMethod, Channel: 1, Payload: []byte{0, 60, 0, 10, 0, 0, 0, 0, 0, 1, 0}})
	badEnd := bytes.Clone(method)
	badEnd[len(badEnd)-1] = 0
	tests := []struct {
		name string
		raw  []byte
		max  uint32
		code uint16 // 0: an I/O error
		io   error
	}{
		{"bad frame end", badEnd, 0, FrameError, nil},
		{"unknown type 4", append([]byte{4}, method[1:]...), 0, FrameError, nil},
		{"unknown type 0", append([]byte{0}, method[1:]...), 0, FrameError, nil},
		{"over frame_max", method, uint32(len(method) - 1), FrameError, nil},
		{"at frame_max", method, uint32(len(method)), 0, nil},
		{"heartbeat with payload", AppendFrame(nil, Frame{Type: FrameHeartbeat, Payload: []byte{1}}), 0, FrameError, nil},
		{"heartbeat on channel 1", AppendFrame(nil, Frame{Type: FrameHeartbeat, Channel: 1}), 0, UnexpectedFrame, nil},
		{"cut in the header", method[:5], 0, 0, io.ErrUnexpectedEOF},
		{"cut in the payload", method[:9], 0, 0, io.ErrUnexpectedEOF},
		{"cut before frame end", method[:len(method)-1], 0, 0, io.ErrUnexpectedEOF},
		{"empty", nil, 0, 0, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(tt.raw), tt.max).ReadFrame()
			switch {
			case tt.code != 0:
				assertCode(t, err, tt.code, nil)
			case tt.io != nil:
				if !errors.Is(err, tt.io) {
					t.Fatalf("err = %v, want %v", err, tt.io)
				}
			case err != nil:
				t.Fatal(err)
			}
		})
	}
}

// TestReadFrameHugeDeclaredSize: a header that declares 4 GiB and then stops
// costs memory for what arrived, not for what it declared, even with no
// frame_max set.
func TestReadFrameHugeDeclaredSize(t *testing.T) {
	raw := append([]byte{FrameBody, 0, 1, 0xff, 0xff, 0xff, 0xff}, bytes.Repeat([]byte{1}, 3<<20)...)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	_, err := NewReader(bytes.NewReader(raw), 0).ReadFrame()
	runtime.ReadMemStats(&ms1)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if d := ms1.TotalAlloc - ms0.TotalAlloc; d > 32<<20 {
		t.Fatalf("%d MiB allocated for 3 MiB received", d>>20)
	}
	// With a frame_max the header alone is refused.
	allocs := testing.AllocsPerRun(20, func() {
		_, err := NewReader(bytes.NewReader(raw[:7]), 131072).ReadFrame()
		if err == nil {
			t.Fatal("accepted")
		}
	})
	if allocs > 10 { // the bufio.Reader and the error; never the payload
		t.Fatalf("%v allocations", allocs)
	}
}

func TestProtocolHeader(t *testing.T) {
	if err := ReadProtocolHeader(bytes.NewReader([]byte("AMQP\x00\x00\x09\x01"))); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"AMQP\x00\x00\x09\x00", "AMQP\x01\x01\x00\x0a", "GET / HTTP/1.1\r\n"} {
		if err := ReadProtocolHeader(bytes.NewReader([]byte(bad))); !errors.Is(err, ErrBadProtocolHeader) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if err := ReadProtocolHeader(bytes.NewReader([]byte("AMQP"))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short: %v", err)
	}
}
