package main

import (
	"context"
	"flag"
	"strconv"

	"github.com/delayproxy/delayproxy/admin"
)

var exchangesCommand = &cliCommand{
	name:    "exchanges",
	summary: "list the delayed exchanges and their pending messages",
	about: `Lists the delayed exchanges (type x-delayed-message) of every vhost, or of
--vhost, with how many messages each holds and when the next one is due. An
exchange deleted while it still held messages shows the type "(deleted)"
until they are discarded. An ordinary exchange holding messages published
with x-opt-delivery-time or x-opt-delivery-delay shows "(delivery-time)";
the default exchange has the empty name (amq.default in the API's paths).`,
	vhost: "",
	flags: func(fs *flag.FlagSet) func(context.Context, *cliRun) error {
		return listExchanges
	},
}

func listExchanges(ctx context.Context, r *cliRun) error {
	list, err := r.client.exchanges(ctx)
	if err != nil {
		return err
	}
	if r.vhost != "" {
		kept := list.Exchanges[:0]
		list.Pending = 0
		for _, e := range list.Exchanges {
			if e.VHost == r.vhost {
				kept = append(kept, e)
				list.Pending += e.Pending
			}
		}
		list.Exchanges = kept
	}
	if r.json {
		return r.printJSON(list)
	}
	now := r.now()
	t := r.table()
	row(t, "VHOST", "EXCHANGE", "TYPE", "PENDING", "NEXT DUE", "DUE IN")
	for _, e := range list.Exchanges {
		typ := e.DelayedType
		if e.Kind == admin.KindDeliveryTime {
			typ = "(" + admin.KindDeliveryTime + ")"
		}
		if !e.Registered {
			typ = "(deleted)"
		}
		row(t, e.VHost, exchangeCell(e.Name), typ, strconv.FormatInt(e.Pending, 10), orDash(e.NextDue), orDash(dueIn(e.NextDueMs, now)))
	}
	return t.Flush()
}
