package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/delayproxy/delayproxy/admin"
)

// Paging of `messages list`: the admin API's largest pages.
const (
	listPage     = 1000 // messages per request
	listBodyPage = 100  // messages per request with --body
	bodyPreview  = 40   // body bytes a table shows
)

var messagesListCommand = &cliCommand{
	name:    "messages list",
	args:    "EXCHANGE",
	nargs:   1,
	summary: "list pending messages of a delayed exchange, in release order",
	about: `Lists the pending messages of the delayed exchange EXCHANGE in --vhost, in
release order (due time, then higher priority, then publish order): the
first --limit of them, or those after --after KEY. KEY is the store key that
"messages cancel --key" takes; the command names the KEY to continue from
when more messages follow.`,
	vhost: "/",
	flags: func(fs *flag.FlagSet) func(context.Context, *cliRun) error {
		limit := fs.Int("limit", 100, "list at most `N` messages; 0 lists all of them")
		after := fs.String("after", "", "start after the message with store key `KEY`")
		withBody := fs.Bool("body", false, "also show each body's size and its first bytes (in --json: the whole body, base64)")
		return func(ctx context.Context, r *cliRun) error {
			if *limit < 0 {
				return withExit(exitUsage, fmt.Errorf("--limit %d: want 0 (all) or more", *limit))
			}
			return listMessages(ctx, r, *after, *limit, *withBody)
		}
	},
}

func listMessages(ctx context.Context, r *cliRun, after string, limit int, withBody bool) error {
	name := r.args[0]
	var out admin.MessagePage
	for {
		page := listPage
		if withBody {
			page = listBodyPage
		}
		if limit > 0 {
			page = min(page, limit-len(out.Messages))
		}
		p, err := r.client.messages(ctx, r.vhost, name, after, page, withBody)
		if err != nil {
			return exchangeErr(err)
		}
		out.Messages = append(out.Messages, p.Messages...)
		out.NextAfter = p.NextAfter
		if p.NextAfter == "" || (limit > 0 && len(out.Messages) >= limit) {
			break
		}
		after = p.NextAfter
	}
	if out.Messages == nil {
		out.Messages = []admin.Message{} // [] in JSON, as the API
	}
	if r.json {
		return r.printJSON(out)
	}
	now := r.now()
	t := r.table()
	head := []string{"KEY", "DUE", "DUE IN", "PRIORITY", "ROUTING KEY", "MESSAGE ID"}
	if withBody {
		head = append(head, "SIZE", "BODY")
	}
	row(t, head...)
	for _, m := range out.Messages {
		cells := []string{m.Key, m.Due, dueIn(m.DueMs, now), strconv.Itoa(int(m.Priority)), orDash(m.RoutingKey), orDash(m.MessageID)}
		if withBody {
			cells = append(cells, strconv.Itoa(len(m.Body)), preview(m.Body))
		}
		row(t, cells...)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	if out.NextAfter != "" {
		fmt.Fprintf(r.stderr, "more messages follow: continue with --after %s\n", out.NextAfter)
	}
	return nil
}

// preview is the start of a body, quoted.
func preview(body []byte) string {
	if len(body) <= bodyPreview {
		return strconv.Quote(string(body))
	}
	return strconv.Quote(string(body[:bodyPreview])) + "..."
}

var messagesCountCommand = &cliCommand{
	name:    "messages count",
	args:    "EXCHANGE",
	nargs:   1,
	summary: "count pending messages of a delayed exchange",
	about: `Counts the pending messages of the delayed exchange EXCHANGE in --vhost and
says when the next one is due.`,
	vhost: "/",
	flags: func(fs *flag.FlagSet) func(context.Context, *cliRun) error {
		return countMessages
	},
}

func countMessages(ctx context.Context, r *cliRun) error {
	e, err := r.client.exchange(ctx, r.vhost, r.args[0])
	if err != nil {
		return exchangeErr(err)
	}
	if r.json {
		return r.printJSON(e)
	}
	t := r.table()
	row(t, "VHOST", "EXCHANGE", "PENDING", "NEXT DUE", "DUE IN")
	row(t, e.VHost, exchangeCell(e.Name), strconv.FormatInt(e.Pending, 10), orDash(e.NextDue), orDash(dueIn(e.NextDueMs, r.now())))
	return t.Flush()
}

var messagesCancelCommand = &cliCommand{
	name:    "messages cancel",
	args:    "EXCHANGE (--message-id ID | --key KEY | --all [--yes])",
	nargs:   1,
	summary: "cancel pending messages of a delayed exchange",
	about: `Cancels pending messages of the delayed exchange EXCHANGE in --vhost: every
one with message-id ID, the one with store key KEY (see "messages list"), or
all of them. A cancelled message is never released. --all asks for
confirmation on the terminal unless --yes is given.`,
	vhost: "/",
	flags: func(fs *flag.FlagSet) func(context.Context, *cliRun) error {
		id := fs.String("message-id", "", "cancel every pending message whose message-id property is `ID`")
		key := fs.String("key", "", "cancel the pending message with store key `KEY`")
		all := fs.Bool("all", false, "cancel every pending message of the exchange")
		yes := fs.Bool("yes", false, "with --all: do not ask for confirmation")
		return func(ctx context.Context, r *cliRun) error {
			chosen := 0
			for _, set := range []bool{*id != "", *key != "", *all} {
				if set {
					chosen++
				}
			}
			if chosen != 1 {
				return withExit(exitUsage, errors.New("give exactly one of --message-id, --key and --all"))
			}
			if *yes && !*all {
				return withExit(exitUsage, errors.New("--yes goes with --all"))
			}
			return cancelMessages(ctx, r, *id, *key, *all, *yes)
		}
	},
}

func cancelMessages(ctx context.Context, r *cliRun, id, key string, all, yes bool) error {
	name := r.args[0]
	// Looking the exchange up first tells an unknown exchange from a cancel
	// that matched nothing (the API answers 404 to both) and gives the
	// confirmation its count.
	e, err := r.client.exchange(ctx, r.vhost, name)
	if err != nil {
		return exchangeErr(err)
	}
	what := fmt.Sprintf("delayed exchange %q in vhost %q", e.Name, e.VHost)
	var n int64
	switch {
	case all:
		if !yes && e.Pending > 0 {
			fmt.Fprintf(r.stderr, "Cancel all %d pending messages of %s? They will never be released. [y/N] ", e.Pending, what)
			line, _ := bufio.NewReader(r.stdin).ReadString('\n')
			if !strings.HasSuffix(line, "\n") {
				fmt.Fprintln(r.stderr) // end the prompt's line
			}
			if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
				return errors.New("not confirmed: nothing cancelled")
			}
		}
		n, err = r.client.cancelAll(ctx, e.VHost, e.Name)
		if err == nil && n == 0 {
			err = withExit(exitNoMatch, fmt.Errorf("%s holds no pending messages", what))
		}
	case id != "":
		n, err = r.client.cancelID(ctx, e.VHost, e.Name, id)
	default:
		n, err = r.client.cancelKey(ctx, e.VHost, e.Name, key)
	}
	if statusOf(err) == 404 {
		err = withExit(exitNoMatch, err)
	}
	if err != nil {
		return err
	}
	if r.json {
		return r.printJSON(admin.Cancelled{Cancelled: n})
	}
	fmt.Fprintf(r.stdout, "cancelled %d pending message%s of %s\n", n, plural(n), what)
	return nil
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}
