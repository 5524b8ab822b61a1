package childproc

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// The ports PickPort draws from lie below the kernel's ephemeral range,
// which every outgoing connection and every listener on port 0 takes its
// port from: a port handed out from inside that range was now and then
// taken by one of them before the program it was meant for bound it
// (a nemesis node failed "bind: address already in use" on a port the
// kernel had just given to someone else). Below it only another picker
// can collide, and it draws at random from the same ~20,000 ports.
const (
	pickLow       = 10000
	pickHighAbove = 32767 // below the default ephemeral range (32768-60999)
)

// reserved are well-known ports inside the pick range that a server on
// this machine may bind later even if free now (RabbitMQ's inter-node and
// management ports while the broker restarts).
var reserved = map[int]bool{15672: true, 15692: true, 25672: true}

// PickPort returns a port on 127.0.0.1 that is free for both TCP and UDP
// at the time of the call (gossip binds both on one port). Another
// process may take it before it is used; callers that can should listen
// on port 0 instead.
func PickPort() (int, error) {
	high := ephemeralLow() - 1
	if high <= pickLow+1000 {
		high = pickHighAbove
	}
	var lastErr error
	for range 50 {
		port := pickLow + rand.IntN(high-pickLow+1)
		if reserved[port] {
			continue
		}
		if lastErr = bindBoth(port); lastErr == nil {
			return port, nil
		}
	}
	return 0, fmt.Errorf("find a free port on 127.0.0.1 in %d-%d: %w", pickLow, high, lastErr)
}

// bindBoth checks that port is free on 127.0.0.1 for TCP and UDP.
func bindBoth(port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	return pc.Close()
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux),
// or 32768 where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return pickHighAbove + 1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return pickHighAbove + 1
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return pickHighAbove + 1
	}
	return n
}

// PickAddr returns "127.0.0.1:port" for a port from PickPort.
func PickAddr() (string, error) {
	port, err := PickPort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}
