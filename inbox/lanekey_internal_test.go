package inbox

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestCloudEventsLaneKey: a CloudEvent without a correlation id runs in
// the lane of its resolved key (cloudEvents:subject), the key its retries
// run under: two subjects are two lanes, not one.
func TestCloudEventsLaneKey(t *testing.T) {
	ce := func(subject string) *amqp.Delivery {
		return &amqp.Delivery{Headers: amqp.Table{"cloudEvents:subject": subject, "x-ordo-source": "billing",
			"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(0)}}
	}
	a, b := ce("order-a"), ce("order-b")
	m, err := FromDelivery(a)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := deliveryLaneKey(a), laneKey(m.Source, m.CorrelationID); got != want {
		t.Fatalf("delivery lane key %q, want the retries' %q", got, want)
	}
	if deliveryLaneKey(a) == deliveryLaneKey(b) {
		t.Fatalf("two subjects share lane key %q", deliveryLaneKey(a))
	}
	withCorr := ce("order-a")
	withCorr.CorrelationId = "corr"
	if got, want := deliveryLaneKey(withCorr), laneKey("billing", "corr"); got != want {
		t.Fatalf("correlation id present: lane key %q, want %q", got, want)
	}
}
