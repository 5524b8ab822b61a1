package nemesis

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// gossipNet is the nodes' gossip network as the nemesis controls it: a
// proxy per node, UDP and TCP on one port, in front of the node's own
// gossip port. Each node binds its own address and advertises its proxy's
// (-gossip-advertise), and every seed is a proxy, so every gossip packet
// and stream reaches a node through its proxy. memberlist answers a ping
// at the address the ping names (the sender's proxy), not at the packet's
// source, so answers go through proxies too.
//
// isolate(s) splits node s from the others: s's proxy drops everything,
// and the others drop what s sends. A UDP sender is known by its source
// address (memberlist sends from its bound socket); a TCP sender (an
// ephemeral port) by the process that owns the connecting socket
// (/proc/net/tcp and /proc/<pid>/fd); during a split a stream from an
// unknown sender is refused. internal/gossipfilter does this in-process; these
// are separate processes. Its methods are safe for concurrent use.
type gossipNet struct {
	binds   []string           // each slot's own gossip address
	pid     func(slot int) int // the slot's current process, 0 when none
	proxies []*gossipProxy

	mu       sync.Mutex
	isolated int // -1: no split
	unknown  int // streams refused because their sender was not found
}

// newGossipNet starts a proxy for each of binds (the nodes' own gossip
// addresses). On error the proxies started are closed.
func newGossipNet(binds []string, pid func(int) int) (*gossipNet, error) {
	g := &gossipNet{binds: binds, pid: pid, isolated: -1}
	for i, b := range binds {
		p, err := startGossipProxy(g, i, b)
		if err != nil {
			g.close()
			return nil, err
		}
		g.proxies = append(g.proxies, p)
	}
	return g, nil
}

// addrs returns the proxies' addresses: what the nodes advertise and join.
func (g *gossipNet) addrs() []string {
	out := make([]string, len(g.proxies))
	for i, p := range g.proxies {
		out[i] = p.addr
	}
	return out
}

// isolate cuts slot s off from every other slot (until heal) and drops
// the streams now open across the cut.
func (g *gossipNet) isolate(s int) {
	g.mu.Lock()
	g.isolated = s
	g.mu.Unlock()
	for _, p := range g.proxies {
		p.dropLinks()
	}
}

// heal ends the split.
func (g *gossipNet) heal() {
	g.mu.Lock()
	g.isolated = -1
	g.mu.Unlock()
}

// splitting returns the isolated slot, or -1.
func (g *gossipNet) splitting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isolated
}

// allowed reports whether traffic from slot from (-1: unknown) may reach
// slot to.
func (g *gossipNet) allowed(from, to int) bool {
	iso := g.splitting()
	switch {
	case iso < 0:
		return true
	case from < 0:
		return false
	default:
		return (from == iso) == (to == iso)
	}
}

// udpSender returns the slot whose node sends from addr, or -1.
func (g *gossipNet) udpSender(addr *net.UDPAddr) int {
	for i, b := range g.binds {
		if b == addr.String() {
			return i
		}
	}
	return -1
}

// tcpSender returns the slot whose node owns the socket connected from
// remote to local, or -1 (counted) when none does.
func (g *gossipNet) tcpSender(remote, local net.Addr) int {
	inode, err := socketInode(remote.String(), local.String())
	if err == nil {
		for i := range g.binds {
			if pid := g.pid(i); pid > 0 && ownsSocket(pid, inode) {
				return i
			}
		}
	}
	g.mu.Lock()
	g.unknown++
	g.mu.Unlock()
	return -1
}

// unknownStreams returns how many streams were refused for an unknown sender.
func (g *gossipNet) unknownStreams() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unknown
}

func (g *gossipNet) close() {
	for _, p := range g.proxies {
		p.close()
	}
}

// socketInode returns the inode of the IPv4 TCP socket whose local address
// is local and remote address remote ("127.0.0.1:port"), from /proc/net/tcp.
func socketInode(local, remote string) (string, error) {
	want := [2]string{procAddr(local), procAddr(remote)}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) > 9 && fs[1] == want[0] && fs[2] == want[1] {
			return fs[9], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no socket %s -> %s", local, remote)
}

// procAddr writes "127.0.0.1:port" as /proc/net/tcp does: the address in
// host byte order (little-endian here) and the port, both in hex.
func procAddr(hostport string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return ""
	}
	ip := net.ParseIP(host).To4()
	n, err := strconv.Atoi(port)
	if ip == nil || err != nil {
		return ""
	}
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], n)
}

// ownsSocket reports whether process pid has socket inode open.
func ownsSocket(pid int, inode string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := "socket:[" + inode + "]"
	for _, e := range entries {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
			return true
		}
	}
	return false
}
