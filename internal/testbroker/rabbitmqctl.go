package testbroker

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

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
