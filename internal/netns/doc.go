// Package netns gives a test a network namespace of its own, joined to the
// test's namespace by a veth pair whose link the test can cut silently:
// from Cut to Restore every packet either way is dropped (a blackhole
// qdisc on both ends), so TCP connections across it go quiet with no
// reset, no FIN and no ICMP error, as on a real partition. The end-to-end
// tests use it to prove the heartbeat handling of the proxy and its
// releaser.
//
//	link := netns.New(t)                          // removed in t.Cleanup
//	conn, err := link.Dial(ctx, "tcp", addr)      // a socket inside the namespace
//	upstream := link.Forward(t, "127.0.0.1:5672") // reach 5672 only across the link
//	link.Cut(t)                                   // ... and later link.Restore(t)
//
// It needs Linux, root and iproute2 (ip netns, veth, tc's blackhole
// qdisc). A test that asks for a link fails when it cannot have one, with
// a message that says what is missing: it never skips.
//
// # Names, addresses and leftovers
//
// Each link is named "dpx-<pid>-<n>" (pid of the test process, n counting
// from 1): the namespace and the veth end in the test's namespace carry
// that name; the other end, inside, is eth0. Each link takes the first /30
// of 10.213.0.0/16 that no address of the test's namespace is in: Host is
// its first address, Peer its second. Links are made under an exclusive
// lock on /run/delayproxy-netns.lock, which also covers the removal of
// leftovers: a link whose process is gone (a run that was killed) is
// deleted before a new one is made, and so is one that carries the name
// about to be used. Removal deletes the veth pair and the namespace; it
// runs in t.Cleanup, so also after a failure.
package netns
