package testbroker

import (
	"os/exec"
	"regexp"
	"strconv"
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

// Connections lists the broker's client connections with rabbitmqctl. The
// tabular output is used because its pids are the form close_connection
// takes (the JSON formatter prints #PID<...>, which it refuses).
func Connections(t testing.TB) []Connection {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "--no-table-headers",
		"pid", "name", "user", "vhost", "client_properties").Output()
	if err != nil {
		t.Fatalf("testbroker: rabbitmqctl list_connections: %v", err)
	}
	var conns []Connection
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 5)
		if len(f) < 5 {
			continue
		}
		c := Connection{PID: f[0], Name: f[1], User: f[2], VHost: f[3]}
		if m := connectionName.FindStringSubmatch(f[4]); m != nil {
			c.ConnectionName = m[1]
		}
		conns = append(conns, c)
	}
	return conns
}

// connectionName finds connection_name in client_properties as rabbitmqctl
// prints them: [{"connection_name","name"},...].
var connectionName = regexp.MustCompile(`\{"connection_name","((?:[^"\\]|\\.)*)"\}`)

// CloseConnections closes, from the broker's side (320 CONNECTION_FORCED
// "closed by test"), every connection whose connection_name starts with
// prefix, and returns how many it closed. Tests close only their own
// connections: others run in parallel on one broker. It is one rabbitmqctl
// call, which matters: each costs seconds on a busy machine.
func CloseConnections(t testing.TB, prefix string) int {
	t.Helper()
	q := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(prefix)
	expr := `Prefix = <<"` + q + `"/utf8>>,
Name = fun(P) ->
    try rabbit_networking:connection_info(P, [client_properties]) of
        [{client_properties, Props}] ->
            case lists:keyfind(<<"connection_name">>, 1, Props) of
                {_, longstr, N} -> N;
                _ -> <<>>
            end
    catch _:_ -> <<>>
    end
end,
Ps = [P || P <- rabbit_networking:connections(),
           binary:longest_common_prefix([Name(P), Prefix]) =:= byte_size(Prefix)],
[rabbit_networking:close_connection(P, "closed by test") || P <- Ps],
length(Ps).`
	out, err := exec.Command("rabbitmqctl", "-q", "eval", expr).CombinedOutput()
	if err != nil {
		t.Fatalf("testbroker: rabbitmqctl eval (close connections %q): %v\n%s", prefix, err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("testbroker: rabbitmqctl eval (close connections %q): %q", prefix, out)
	}
	return n
}
