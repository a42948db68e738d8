package main

import "testing"

func TestNewAdminClientBase(t *testing.T) {
	for _, tt := range []struct {
		server, want string
	}{
		{"127.0.0.1:15673", "http://127.0.0.1:15673"},
		{"localhost:15673", "http://localhost:15673"},
		{"[::1]:15673", "http://[::1]:15673"},
		{"https://proxy.example:8443/admin/", "https://proxy.example:8443/admin"},
		{"http://127.0.0.1:15673/?x=1#y", "http://127.0.0.1:15673"},
		// An unspecified host, as in DELAYPROXY_HTTP_ADDR, is this machine.
		{":15673", "http://127.0.0.1:15673"},
		{"0.0.0.0:15673", "http://127.0.0.1:15673"},
		{"[::]:15673", "http://[::1]:15673"},
		{"http://:15673", "http://127.0.0.1:15673"},
		{"https://[::]:15673/admin", "https://[::1]:15673/admin"},
	} {
		c, err := newAdminClient(tt.server, "")
		if err != nil {
			t.Errorf("newAdminClient(%q): %v", tt.server, err)
			continue
		}
		if c.base != tt.want {
			t.Errorf("newAdminClient(%q).base = %q, want %q", tt.server, c.base, tt.want)
		}
	}
	for _, server := range []string{"ftp://x:21", "127.0.0.1", "http://", "http://host"} {
		if _, err := newAdminClient(server, ""); err == nil {
			t.Errorf("newAdminClient(%q) took it, want an error", server)
		}
	}
}
