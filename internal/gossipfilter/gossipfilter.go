// Package gossipfilter is a gossip network that tests can split: it
// moved here from package membership, whose public API it served only
// for tests.
package gossipfilter

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport is memberlist's UDP+TCP transport with an outgoing
// filter: packets and connections to an address Allow rejects are dropped
// as a broken network would drop them. Tests use it to split a cluster
// while every node still reaches PostgreSQL. If every node filters the
// other group, no gossip crosses in either direction.
type Transport struct {
	*memberlist.NetTransport
	// Allow reports whether this node may reach addr (host:port). It is
	// called concurrently.
	Allow func(addr string) bool
}

// New listens on bind (host:port).
func New(bind string, allow func(addr string) bool) (*Transport, error) {
	host, portStr, err := net.SplitHostPort(bind)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, err
	}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port})
	if err != nil {
		return nil, fmt.Errorf("gossip transport on %s: %w", bind, err)
	}
	return &Transport{NetTransport: nt, Allow: allow}, nil
}

// WriteTo drops packets to filtered addresses.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if !t.Allow(addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteTo(b, addr)
}

// DialTimeout fails for filtered addresses.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if !t.Allow(addr) {
		return nil, fmt.Errorf("dial %s: network split (filtered)", addr)
	}
	return t.NetTransport.DialTimeout(addr, timeout)
}

// WriteToAddress drops packets to filtered addresses (memberlist prefers
// this node-aware form when the transport has it).
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if !t.Allow(a.Addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteToAddress(b, a)
}

// DialAddressTimeout fails for filtered addresses.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if !t.Allow(a.Addr) {
		return nil, fmt.Errorf("dial %s: network split (filtered)", a.Addr)
	}
	return t.NetTransport.DialAddressTimeout(a, timeout)
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)
