// Package e2e is delayproxy's end-to-end suite: whole proxies (delayproxy.New
// and Run, or the proxy as a child process) in front of the real RabbitMQ,
// driven by real clients, through the exported API only. It holds tests
// only.
//
// What the suite covers: delayed delivery through the proxy (delayed_*),
// the service around it: admin API, metrics, logs, TLS, heartbeats
// (service_*), RabbitMQ's own authorization of delayed publishes
// (auth_test), the reliability claims of the README (reliability_*):
// SIGKILL rounds, RabbitMQ closing connections, a full disk, hostile input,
// many connections, silent network partitions (partition_test: a hop across
// a veth link of internal/netns, cut; Linux, as root), and ten real clients
// (clients_*, programs in testdata/clients). Tests that stop RabbitMQ or set
// its memory alarm
// (TestFault*, fault_*) build only with -tags brokerfaults and run apart,
// one package at a time:
//
//	go test -race -tags brokerfaults -p 1 -run '^TestFault' ./...
//
// The delayed_* tests and the broker-stop fault tests run on RabbitMQ 3.10
// and 4.3 (testbroker.Each, EachInTurn), with the helpers' On variants;
// the rest on 3.10.
//
// Shared helpers live beside internal/testbroker: testbroker (the broker),
// testwait, testcert, testpaging (the admin API's pages), crashtest
// (publishers with a ledger, child processes) and netns (network namespaces
// whose link can be cut).
package e2e
