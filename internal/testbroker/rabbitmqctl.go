package testbroker

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// Connection is one client connection as rabbitmqctl lists it.
type Connection struct {
	PID            string
	Name           string // peer -> broker addresses
	User           string
	VHost          string
	ConnectionName string // the client's connection_name property, if any
}

// Connections lists the broker's client connections with rabbitmqctl.
func Connections(t testing.TB) []Connection {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections",
		"pid", "name", "user", "vhost", "client_properties", "--formatter", "json").Output()
	if err != nil {
		t.Fatalf("testbroker: rabbitmqctl list_connections: %v", err)
	}
	var rows []struct {
		PID   string  `json:"pid"`
		Name  string  `json:"name"`
		User  string  `json:"user"`
		VHost string  `json:"vhost"`
		Props [][]any `json:"client_properties"`
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("testbroker: rabbitmqctl list_connections output: %v\n%s", err, out)
	}
	conns := make([]Connection, 0, len(rows))
	for _, r := range rows {
		c := Connection{PID: r.PID, Name: r.Name, User: r.User, VHost: r.VHost}
		for _, p := range r.Props {
			if len(p) == 3 && p[0] == "connection_name" {
				c.ConnectionName = fmt.Sprint(p[2])
			}
		}
		conns = append(conns, c)
	}
	return conns
}

// CloseConnections closes, from the broker's side, every connection whose
// connection_name starts with prefix, and returns how many it closed. Tests
// close only their own connections: others run in parallel on one broker.
func CloseConnections(t testing.TB, prefix string) int {
	t.Helper()
	n := 0
	for _, c := range Connections(t) {
		if c.ConnectionName == "" || !strings.HasPrefix(c.ConnectionName, prefix) {
			continue
		}
		if out, err := exec.Command("rabbitmqctl", "-q", "close_connection", c.PID, "closed by test").CombinedOutput(); err != nil {
			t.Fatalf("testbroker: rabbitmqctl close_connection %s: %v\n%s", c.PID, err, out)
		}
		n++
	}
	return n
}
