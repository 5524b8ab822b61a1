package membership

import (
	"sync"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/gossipfilter"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// compressMsg is memberlist's message type of an LZW-compressed message,
// the first byte of such a packet or stream message.
const compressMsg = 9

// sentTypes is a gossip transport that records the message type of each
// packet it sends.
type sentTypes struct {
	*gossipfilter.Transport
	mu    sync.Mutex
	types map[byte]int
	n     int
}

func (s *sentTypes) WriteTo(b []byte, addr string) (time.Time, error) {
	s.mu.Lock()
	if len(b) > 0 {
		s.types[b[0]]++
		s.n++
	}
	s.mu.Unlock()
	return s.Transport.WriteTo(b, addr)
}

func (s *sentTypes) WriteToAddress(b []byte, addr string) (time.Time, error) {
	return s.WriteTo(b, addr)
}

// TestGossipUncompressed: members send their gossip uncompressed (LZW on
// every message cost about 8 % of a capped node's CPU in a four-node
// cluster), and members that gossip among themselves still agree.
func TestGossipUncompressed(t *testing.T) {
	addrs := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	var sent []*sentTypes
	var nodes []*running
	for i, name := range []string{"a", "b", "c"} {
		tr, err := gossipfilter.New(addrs[i], func(string) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		s := &sentTypes{Transport: tr, types: map[byte]int{}}
		sent = append(sent, s)
		cfg := testConfig(name, addrs[i])
		cfg.Join = addrs[:1]
		cfg.Transport = s
		nodes = append(nodes, start(t, cfg))
	}
	for _, n := range nodes {
		waitAlive(t, n, []string{"a", "b", "c"}, 30*time.Second)
	}
	// Metadata changes make every member gossip alive messages of a few
	// hundred bytes, the ones LZW shrinks.
	for _, n := range nodes {
		n.m.SetHealth(Health{Broker: true, Database: true, Sources: "default billing shipping invoicing"})
	}
	testkit.WaitFor(t, 30*time.Second, "300 gossip packets sent", func() bool {
		total := 0
		for _, s := range sent {
			s.mu.Lock()
			total += s.n
			s.mu.Unlock()
		}
		return total >= 300
	})
	for i, s := range sent {
		s.mu.Lock()
		if n := s.types[compressMsg]; n > 0 {
			t.Errorf("%s sent %d compressed packets of %d (types %v)", nodes[i].m.cfg.NodeName, n, s.n, s.types)
		}
		s.mu.Unlock()
	}
}
