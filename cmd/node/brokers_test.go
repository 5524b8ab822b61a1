package main

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
)

// TestBrokerURLList: with -amqp-url naming a closed port first and the
// real broker second, the node connects to the second, publishes, and
// /status names it (password masked).
func TestBrokerURLList(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	closed := "amqp://guest:guest@" + testkit.FreeAddr(t) + "/"
	_, base := f.start(t, "brokers-node", "ORDO_AMQP_URL="+closed+","+testkit.AMQPURL())
	f.enqueue(t, 50, 5)
	f.checker.WaitDistinct(t, 50, 30*time.Second)

	real, err := url.Parse(testkit.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	var st node.Status
	if code := getJSON(t, base+"/status", &st); code != 200 {
		t.Fatalf("/status: %d", code)
	}
	if !st.Broker || !strings.Contains(st.BrokerURL, real.Host) {
		t.Fatalf("/status: connected %v to %q, want the second URL (%s)", st.Broker, st.BrokerURL, real.Host)
	}
	if strings.Contains(st.BrokerURL, "guest:guest") {
		t.Errorf("/status shows the password: %q", st.BrokerURL)
	}
}
