package inbox

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestNackedDeadLettersDoNotLeakChannels: a nacked
// dead-letter publish must close its channel, or enough nacks exhaust the
// connection's channel_max (2047) and every later dead letter fails. The
// dead-letter queue here rejects every publish (max length 0,
// reject-publish), so each one is nacked.
func TestNackedDeadLettersDoNotLeakChannels(t *testing.T) {
	cfg := LocalConfig(testkit.UniqueName(t, "dl"))
	cfg.AMQPURL = testkit.AMQPURL()
	cfg.Logger = slog.Default()
	topo := TopologyOf(cfg)
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(topo.DeadQueue(), false, false, false, false,
			amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
		return err
	})
	t.Cleanup(func() {
		testkit.WithChannel(t, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(topo.DeadQueue(), false, false, false)
			return err
		})
	})
	d := newDeadLetters(cfg, topo)
	defer d.close()
	ctx := testkit.Context(t, 2*time.Minute)
	m := &Message{ID: "m", CorrelationID: "k", KeySeq: 1, Body: []byte("{}")}
	const n = 2100 // more than channel_max
	for i := range n {
		err := d.DeadLetter(ctx, m, "test", 1)
		if err == nil || !strings.Contains(err.Error(), "nacked") {
			t.Fatalf("dead letter %d of %d: %v, want nacked", i+1, n, err)
		}
	}
}
