package crashtest

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// CloseConnections closes, from RabbitMQ's side (320 CONNECTION_FORCED
// "closed by test"), every connection whose connection_name starts with
// prefix, and returns how many it closed. One rabbitmqctl call, which
// matters: each one costs seconds on a busy machine.
//
// It replaces testbroker.CloseConnections, which cannot close anything on
// RabbitMQ 3.10: `list_connections --formatter json` prints pids as
// "#PID<12576.29610.2>", which close_connection refuses
// ({:invalid_pid_syntax, ...}, exit status 69).
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
		t.Fatalf("crashtest: rabbitmqctl eval (close connections %q): %v\n%s", prefix, err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("crashtest: rabbitmqctl eval (close connections %q): %q", prefix, out)
	}
	return n
}
