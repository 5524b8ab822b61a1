package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// failWith is a relay.Publisher that fails every message with err.
type failWith struct{ err error }

func (f failWith) Publish(_ context.Context, _ *relay.Message, settle func(relay.Result)) error {
	settle(relay.Result{Outcome: relay.Failed, Err: f.err})
	return nil
}
func (failWith) Connected() bool { return true }

// TestConfirmTimeoutsCountedThroughTheBroker: a failure the RabbitMQ
// publisher reports as a confirm timeout (wrapped, as it settles it)
// counts in ordo_messages_confirm_timeouts_total, through the broker's
// TimedOut; any other failure counts as failed only.
func TestConfirmTimeoutsCountedThroughTheBroker(t *testing.T) {
	var b broker = rabbitBroker{}
	for _, c := range []struct {
		err      error
		timedOut float64
	}{
		{fmt.Errorf("%w (%v)", rabbitmq.ErrConfirmTimeout, 30*time.Second), 1},
		{errors.New("exchange not found"), 0},
	} {
		fams := newPublishFamilies()
		m := fams.forSource("default", b.TimedOut)
		p := observedPublisher{Publisher: failWith{c.err}, m: m}
		if err := p.Publish(context.Background(), &relay.Message{OccurredAt: time.Now()}, func(relay.Result) {}); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(m.failed); got != 1 {
			t.Errorf("%v: failed = %v, want 1", c.err, got)
		}
		if got := testutil.ToFloat64(m.timedOut); got != c.timedOut {
			t.Errorf("%v: confirm timeouts = %v, want %v", c.err, got, c.timedOut)
		}
	}
}

// TestBrokerStateKeepsRabbitMQNames: /status's "broker" object is the
// RabbitMQ publisher's state under the JSON names it has always had.
func TestBrokerStateKeepsRabbitMQNames(t *testing.T) {
	in := rabbitmq.State{Connected: true, Blocked: "low on memory", BlockedSeconds: 2.5, ChannelsOpened: 3, Stalls: 1}
	want, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(BrokerState{Connected: in.Connected, Blocked: in.Blocked, BlockedSeconds: in.BlockedSeconds,
		ChannelsOpened: in.ChannelsOpened, Stalls: in.Stalls})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("broker state %s, the publisher's %s", got, want)
	}
}

// TestOneFileNamesRabbitMQ: node reaches its broker through the broker
// interface; only rabbitmq.go, its RabbitMQ wiring, imports the
// publisher or the AMQP client.
func TestOneFileNamesRabbitMQ(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "rabbitmq.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasSuffix(p, "/relay/rabbitmq") || strings.Contains(p, "amqp091") {
				t.Errorf("%s imports %s: the RabbitMQ wiring belongs in rabbitmq.go", name, p)
			}
		}
	}
}
