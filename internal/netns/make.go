//go:build linux

package netns

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

const (
	prefix   = "dpx-"                       // of every link's name
	runDir   = "/run/netns"                 // where ip netns keeps named namespaces
	lockPath = "/run/delayproxy-netns.lock" // serialises making links, across processes
	maxName  = 15                           // IFNAMSIZ - 1: the longest interface name
	linkBits = 30                           // each link's prefix length: a /30
)

// pool is where links take their /30.
var pool = netip.MustParsePrefix("10.213.0.0/16")

// mu is held while a link is made or removed, with the file lock while
// one is made; it guards made and live.
var (
	mu   sync.Mutex
	made int                 // links this process made, for their names
	live = map[string]bool{} // names of this process's links not yet removed
)

// create makes a link: the namespace, the veth pair, an address on each
// end, everything up.
func create() (*Link, error) {
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: %w", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("not root (euid %d)", os.Geteuid())
	}
	mu.Lock()
	defer mu.Unlock()
	unlock, err := lockFile()
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeLeftovers()

	made++
	name := prefix + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(made)
	if len(name) > maxName {
		return nil, fmt.Errorf("link name %q is longer than an interface name may be", name)
	}
	block, err := freeBlock()
	if err != nil {
		return nil, err
	}
	l := &Link{Name: name, Host: block.Addr().Next(), Peer: block.Addr().Next().Next()}
	if err := l.build(block.Bits()); err != nil {
		return nil, errors.Join(err, l.destroy())
	}
	live[name] = true
	return l, nil
}

// build makes l's namespace and veth pair and opens the namespace.
func (l *Link) build(bits int) error {
	host := netip.PrefixFrom(l.Host, bits).String()
	peer := netip.PrefixFrom(l.Peer, bits).String()
	for _, args := range [][]string{
		{"netns", "add", l.Name},
		{"link", "add", l.Name, "type", "veth", "peer", "name", innerDev, "netns", l.Name},
		{"addr", "add", host, "dev", l.Name},
		{"link", "set", l.Name, "up"},
		{"-n", l.Name, "addr", "add", peer, "dev", innerDev},
		{"-n", l.Name, "link", "set", innerDev, "up"},
		{"-n", l.Name, "link", "set", "lo", "up"},
	} {
		if err := run("ip", args...); err != nil {
			return err
		}
	}
	ns, err := os.Open(filepath.Join(runDir, l.Name))
	if err != nil {
		return err
	}
	l.ns = ns
	return nil
}

// remove deletes l's veth pair (both ends go together) and its namespace;
// what is already gone is no error. A socket made inside keeps the
// namespace itself alive, nameless, until it closes.
func (l *Link) remove() error {
	mu.Lock()
	defer mu.Unlock()
	delete(live, l.Name)
	return l.destroy()
}

// destroy is remove without the bookkeeping.
func (l *Link) destroy() error {
	var errs []error
	if l.ns != nil {
		errs = append(errs, l.ns.Close())
	}
	errs = append(errs, deleteLink(l.Name))
	return errors.Join(errs...)
}

// deleteLink deletes the veth end called name and the namespace of that
// name, whichever exist.
func deleteLink(name string) error {
	var errs []error
	if _, err := os.Stat("/sys/class/net/" + name); err == nil {
		errs = append(errs, run("ip", "link", "del", name))
	}
	if _, err := os.Stat(filepath.Join(runDir, name)); err == nil {
		errs = append(errs, run("ip", "netns", "del", name))
	}
	return errors.Join(errs...)
}

// removeLeftovers deletes the links no running test owns: those of a
// process that is gone, and those named as by this process but not made
// by it (an earlier process with the same pid). Failures are left for the
// steps after to report.
func removeLeftovers() {
	names := map[string]bool{}
	if ents, err := os.ReadDir(runDir); err == nil {
		for _, e := range ents {
			names[e.Name()] = true
		}
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			names[e.Name()] = true
		}
	}
	for name := range names {
		pid, ok := ownerOf(name)
		if !ok || live[name] {
			continue
		}
		if pid == os.Getpid() || !alive(pid) {
			deleteLink(name)
		}
	}
}

// ownerOf is the pid in a link's name; false for a name that is not a
// link's.
func ownerOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	pid, n, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(pid)
	if _, err2 := strconv.Atoi(n); err != nil || err2 != nil || p <= 0 {
		return 0, false
	}
	return p, true
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// freeBlock is the first /30 of the pool that no IPv4 address of the
// test's namespace lies in.
func freeBlock() (netip.Prefix, error) {
	out, err := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip -o -4 addr show: %w", err)
	}
	used := map[netip.Prefix]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if p, err := netip.ParsePrefix(f[i+1]); f[i] == "inet" && err == nil && pool.Contains(p.Addr()) {
				b, _ := p.Addr().Prefix(linkBits)
				used[b] = true
			}
		}
	}
	base := pool.Addr().As4()
	first := binary.BigEndian.Uint32(base[:])
	for i := range uint32(1) << (linkBits - pool.Bits()) {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], first+i<<(32-linkBits))
		if b := netip.PrefixFrom(netip.AddrFrom4(a), linkBits); !used[b] {
			return b, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /%d left in %v", linkBits, pool)
}

// lockFile takes the exclusive lock that serialises making links across
// processes, and returns its release.
func lockFile() (unlock func(), err error) {
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	return func() { f.Close() }, nil
}

// run runs an iproute2 command; its error carries what the command said.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
