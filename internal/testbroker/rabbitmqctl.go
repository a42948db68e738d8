package testbroker

import (
	"fmt"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Ctl runs rabbitmqctl -q with args on the default broker's node and
// returns its output; it fails the test if the command fails.
func Ctl(t testing.TB, args ...string) string {
	t.Helper()
	return Default(t).Ctl(t, args...)
}

// Ctl runs the broker's rabbitmqctl -q with args and returns its output; it
// fails the test if the command fails.
func (b Broker) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	return b.run(t, "", args...)
}

// AddUser creates a user on the default broker (Broker.AddUser).
func AddUser(t testing.TB, user, password string) {
	t.Helper()
	Default(t).AddUser(t, user, password)
}

// AddUser creates a user on the broker without permissions (grant them
// with Ctl and set_permissions) and deletes it in t.Cleanup. Its password
// appears in no failure message.
func (b Broker) AddUser(t testing.TB, user, password string) {
	t.Helper()
	b.run(t, password, "add_user", user, password)
	t.Cleanup(func() { b.Ctl(t, "delete_user", user) })
}

// run is Ctl with secret (when not "") hidden in failure messages.
func (b Broker) run(t testing.TB, secret string, args ...string) string {
	t.Helper()
	out, err := exec.Command(b.ctl, append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("testbroker: %s %s: %v\n%s", b.ctl, strings.Join(args, " "), err, out)
		if secret != "" {
			msg = strings.ReplaceAll(msg, secret, "<secret>")
		}
		t.Fatal(msg)
	}
	return string(out)
}

// CloseConnections closes, from the default broker's side (320 CONNECTION_FORCED
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
        [{client_properties, Props}] when is_list(Props) ->
            case lists:keyfind(<<"connection_name">>, 1, Props) of
                {_, longstr, N} -> N;
                _ -> <<>>
            end;
        _ -> <<>> % still in its handshake: client_properties is none
    catch _:_ -> <<>>
    end
end,
Ps = [P || P <- rabbit_networking:connections(),
           binary:longest_common_prefix([Name(P), Prefix]) =:= byte_size(Prefix)],
[rabbit_networking:close_connection(P, "closed by test") || P <- Ps],
length(Ps).`
	out := Ctl(t, "eval", expr)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("testbroker: rabbitmqctl eval (close connections %q): %q", prefix, out)
	}
	return n
}

// VHost creates a vhost of the test's on the default broker, named prefix
// plus a unique suffix, gives AMQP_URL's user every permission on it, and
// deletes it in t.Cleanup.
func VHost(t testing.TB, prefix string) string {
	t.Helper()
	vh := fmt.Sprintf("%s%d", prefix, time.Now().UnixNano())
	Ctl(t, "add_vhost", vh)
	t.Cleanup(func() { Ctl(t, "delete_vhost", vh) })
	Permit(t, vh, true)
	return vh
}

// Permit gives AMQP_URL's user every permission on vhost, or with allow
// false takes them all away, on the default broker: its connections to
// vhost are refused from then on (530 NOT_ALLOWED), those open stay open.
func Permit(t testing.TB, vhost string, allow bool) {
	t.Helper()
	u, err := url.Parse(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if allow {
		Ctl(t, "set_permissions", "-p", vhost, u.User.Username(), ".*", ".*", ".*")
	} else {
		Ctl(t, "clear_permissions", "-p", vhost, u.User.Username())
	}
}
