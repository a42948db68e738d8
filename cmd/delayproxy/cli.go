package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy"
)

// The operator's commands ask a running proxy's admin API (package admin)
// what it holds and cancel messages: `delayproxy exchanges`, `delayproxy
// messages list|count|cancel EXCHANGE`, `delayproxy upcoming`. This file
// holds their dispatch, the flags they share and their exit statuses; one
// file per command group holds the commands.

// Exit statuses of the operator commands, distinct so that scripts can
// tell the failures apart; every --help lists them.
const (
	exitOK           = 0
	exitFailure      = 1 // any other failure: the server answered an error, a token file is unreadable, a cancel was not confirmed
	exitUsage        = 2 // bad flags or arguments, as for the proxy's own settings
	exitUnreachable  = 3 // nothing answers at --server
	exitUnauthorized = 4 // 401: no admin token, or the wrong one
	exitNoExchange   = 5 // 404: no such delayed exchange in the vhost
	exitNoMatch      = 6 // a cancel matched no pending message
)

const exitStatusHelp = `Exit status:
  0  done
  1  any other failure (an error answered by the server, an unreadable token file, a cancel not confirmed)
  2  bad flags or arguments
  3  the server is unreachable (--server)
  4  the server refused the admin token, or none was given (401)
  5  no such delayed exchange in the vhost (404)
  6  a cancel matched no pending message
`

// cliIO is what an operator command reads and writes.
type cliIO struct {
	getenv func(string) string
	now    func() time.Time // for "due in" columns
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// cliCommand is one operator command.
type cliCommand struct {
	name    string // as typed: "messages list"
	args    string // positional arguments in the usage line, e.g. "EXCHANGE"
	nargs   int    // how many positional arguments it takes
	summary string // one line, for the group's help
	about   string // a paragraph, for its own help
	// vhost is the default of --vhost; "-" means the command has no --vhost.
	vhost string
	// flags declares the command's own flags; run gets what they parsed.
	flags func(fs *flag.FlagSet) func(ctx context.Context, cmd *cliRun) error
}

// cliRun is one invocation of a command: its parsed flags and arguments.
type cliRun struct {
	cliIO
	name   string
	args   []string
	vhost  string
	json   bool
	client *adminClient
}

// cliCommands lists every operator command, in the order of the help.
var cliCommands = []*cliCommand{exchangesCommand, messagesListCommand, messagesCountCommand, messagesCancelCommand, upcomingCommand}

// cliGroups are the first words that start an operator command.
var cliGroups = map[string]bool{"exchanges": true, "messages": true, "upcoming": true}

// isCLICommand reports whether args start an operator command rather than
// the proxy.
func isCLICommand(args []string) bool { return len(args) > 0 && cliGroups[args[0]] }

// runCLI runs the operator command args (isCLICommand is true) and returns
// its exit status.
func runCLI(args []string, cio cliIO) int {
	var cmd *cliCommand
	for _, c := range cliCommands {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && slices.Equal(args[:len(words)], words) {
			cmd, args = c, args[len(words):]
			break
		}
	}
	if cmd == nil { // "messages" alone, with --help, or with an unknown subcommand
		group := args[0]
		if len(args) > 1 && isHelp(args[1]) {
			writeGroupHelp(cio.stdout, group)
			return exitOK
		}
		if len(args) > 1 {
			fmt.Fprintf(cio.stderr, "delayproxy %s: unknown command %q\n", group, args[1])
		} else {
			fmt.Fprintf(cio.stderr, "delayproxy %s: which one?\n", group)
		}
		writeGroupHelp(cio.stderr, group)
		return exitUsage
	}
	return cmd.run(args, cio)
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// run parses args, reaches the server and runs the command.
func (c *cliCommand) run(args []string, cio cliIO) int {
	fs := flag.NewFlagSet("delayproxy "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defaultServer := delayproxy.DefaultConfig().HTTPAddr
	if v := cio.getenv("DELAYPROXY_HTTP_ADDR"); v != "" {
		defaultServer = v
	}
	server := fs.String("server", defaultServer,
		"`ADDR` of the proxy's HTTP side (its --http-addr): host:port or an http(s):// URL; DELAYPROXY_HTTP_ADDR when set")
	tokenFile := fs.String("admin-token-file", "",
		"read the admin token from `FILE` (surrounding white space is ignored); without it the token is DELAYPROXY_ADMIN_TOKEN, else the file named by DELAYPROXY_ADMIN_TOKEN_FILE")
	asJSON := fs.Bool("json", false, "print the admin API's JSON instead of a table")
	var vhost *string
	if c.vhost != "-" {
		help := "the `VHOST` of the delayed exchange"
		if c.vhost == "" {
			help = "only the delayed exchanges of `VHOST` (without it: every vhost)"
		}
		vhost = fs.String("vhost", c.vhost, help)
	}
	common := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { common[f.Name] = true })
	body := c.flags(fs)

	pos, err := parseInterleaved(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.writeHelp(cio.stdout, fs, common)
		return exitOK
	case err == nil && len(pos) != c.nargs:
		if len(pos) < c.nargs {
			err = fmt.Errorf("missing %s", strings.Fields(c.args)[len(pos)])
		} else {
			err = fmt.Errorf("unexpected argument %q", pos[c.nargs])
		}
	}
	if err != nil {
		fmt.Fprintf(cio.stderr, "delayproxy %s: %v\nUsage: %s (see --help)\n", c.name, err, c.usageLine())
		return exitUsage
	}

	token, source, err := adminToken(*tokenFile, cio.getenv)
	if err != nil {
		fmt.Fprintf(cio.stderr, "delayproxy %s: %v\n", c.name, err)
		return exitFailure
	}
	client, err := newAdminClient(*server, token)
	if err != nil {
		fmt.Fprintf(cio.stderr, "delayproxy %s: %v\n", c.name, err)
		return exitUsage
	}
	r := &cliRun{cliIO: cio, name: c.name, args: pos, json: *asJSON, client: client}
	if vhost != nil {
		r.vhost = *vhost
	}
	err = body(context.Background(), r)
	if err == nil {
		return exitOK
	}
	code := exitCodeOf(err)
	msg := err.Error()
	if code == exitUnauthorized {
		if token == "" {
			msg = "the server wants the admin token: set DELAYPROXY_ADMIN_TOKEN or pass --admin-token-file"
		} else {
			msg = "the server refused the admin token from " + source
		}
	}
	fmt.Fprintf(cio.stderr, "delayproxy %s: %s\n", c.name, msg)
	if code == exitUsage {
		fmt.Fprintf(cio.stderr, "Usage: %s (see --help)\n", c.usageLine())
	}
	return code
}

// parseInterleaved parses flags anywhere among the positional arguments
// ("messages list orders --json" as well as "messages list --json orders");
// after "--" everything is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// adminToken finds the admin token: --admin-token-file, else
// DELAYPROXY_ADMIN_TOKEN, else the file in DELAYPROXY_ADMIN_TOKEN_FILE; ""
// when none is set. source names where it came from, for errors.
func adminToken(flagFile string, getenv func(string) string) (token, source string, err error) {
	file, source := flagFile, "--admin-token-file "+flagFile
	if file == "" {
		if t := getenv("DELAYPROXY_ADMIN_TOKEN"); t != "" {
			return t, "DELAYPROXY_ADMIN_TOKEN", nil
		}
		file = getenv("DELAYPROXY_ADMIN_TOKEN_FILE")
		source = "DELAYPROXY_ADMIN_TOKEN_FILE (" + file + ")"
	}
	if file == "" {
		return "", "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", "", fmt.Errorf("admin token: %v", err)
	}
	token = strings.TrimSpace(string(b))
	if token == "" {
		return "", "", fmt.Errorf("admin token: %s is empty", file)
	}
	return token, source, nil
}

// exitError gives an error its exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withExit gives err the exit status code.
func withExit(code int, err error) error { return &exitError{code: code, err: err} }

// exitCodeOf maps a command's error to its exit status.
func exitCodeOf(err error) int {
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errUnreachable):
		return exitUnreachable
	case statusOf(err) == 401:
		return exitUnauthorized
	case statusOf(err) == 400: // a --key or --after that is no store key
		return exitUsage
	}
	return exitFailure
}

// exchangeErr marks the API's 404 for an exchange path as an unknown
// exchange.
func exchangeErr(err error) error {
	if statusOf(err) == 404 {
		return withExit(exitNoExchange, err)
	}
	return err
}

func (c *cliCommand) usageLine() string {
	line := "delayproxy " + c.name
	if c.args != "" {
		line += " " + c.args
	}
	return line + " [flags]"
}

// writeHelp prints the command's help: usage, what it does, its own flags,
// the common ones and the exit statuses.
func (c *cliCommand) writeHelp(w io.Writer, fs *flag.FlagSet, common map[string]bool) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.usageLine(), c.about)
	for _, own := range []bool{true, false} {
		title := "\nFlags:\n"
		if !own {
			title = "\nCommon flags:\n"
		}
		fs.VisitAll(func(f *flag.Flag) {
			if common[f.Name] == own {
				return
			}
			fmt.Fprint(w, title)
			title = ""
			arg, usage := flag.UnquoteUsage(f)
			head := "  --" + f.Name
			if arg != "" {
				head += " " + arg
			}
			if f.DefValue != "" && arg != "" {
				usage += " [default " + strconv.Quote(f.DefValue) + "]"
			}
			fmt.Fprintf(w, "%s\n      %s\n", head, usage)
		})
	}
	fmt.Fprintf(w, "\n%s", exitStatusHelp)
}

// writeGroupHelp lists the commands of a group ("messages").
func writeGroupHelp(w io.Writer, group string) {
	fmt.Fprintf(w, "Usage:\n")
	for _, c := range cliCommands {
		if strings.Fields(c.name)[0] == group {
			fmt.Fprintf(w, "  %s\n      %s\n", c.usageLine(), c.summary)
		}
	}
	fmt.Fprintf(w, "\nEach takes --help.\n")
}
