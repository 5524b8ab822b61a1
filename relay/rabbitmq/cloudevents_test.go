package rabbitmq

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/wire"
)

// ceSpecs reads attributes named with the AMQP binding's prefix.
var ceSpecs = spec.WithPrefix(wire.CloudEventsPrefix)

// ceDelivery is an AMQP 0-9-1 delivery as a CloudEvents SDK binding
// message in binary mode: cloudEvents:* headers are attributes (or
// extensions), content-type the datacontenttype, the body the data, as
// the AMQP binding maps them.
type ceDelivery struct{ d *amqp.Delivery }

var _ binding.MessageMetadataReader = ceDelivery{}

func (m ceDelivery) ReadEncoding() binding.Encoding {
	if _, ok := m.d.Headers[wire.HeaderCloudEventsSpecVersion]; ok {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m ceDelivery) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m ceDelivery) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	sv, _ := m.d.Headers[wire.HeaderCloudEventsSpecVersion].(string)
	v := ceSpecs.Version(sv)
	if v == nil {
		return binding.ErrUnknownEncoding
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	for k, val := range m.d.Headers {
		if a := v.Attribute(k); a != nil {
			if err := w.SetAttribute(a, val); err != nil {
				return err
			}
		} else if strings.HasPrefix(strings.ToLower(k), strings.ToLower(wire.CloudEventsPrefix)) {
			if err := w.SetExtension(strings.ToLower(k[len(wire.CloudEventsPrefix):]), val); err != nil {
				return err
			}
		}
	}
	if m.d.ContentType != "" {
		if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
			return err
		}
	}
	if len(m.d.Body) > 0 {
		if err := w.SetData(bytes.NewReader(m.d.Body)); err != nil {
			return err
		}
	}
	return w.End(ctx)
}

func (m ceDelivery) Finish(error) error { return nil }

// header returns the header named name, compared without case (the SDK
// lower-cases the prefix).
func (m ceDelivery) header(name string) any {
	for k, v := range m.d.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return nil
}

func (m ceDelivery) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	sv, _ := m.d.Headers[wire.HeaderCloudEventsSpecVersion].(string)
	v := ceSpecs.Version(sv)
	if v == nil {
		return nil, nil
	}
	a := v.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		if m.d.ContentType == "" {
			return a, nil
		}
		return a, m.d.ContentType
	}
	return a, m.header(a.PrefixedName())
}

func (m ceDelivery) GetExtension(name string) interface{} {
	return m.header(wire.CloudEventsPrefix + name)
}

// getOne takes the one message the harness's queue holds, waiting for it.
func (h *brokerHarness) getOne(t *testing.T) amqp.Delivery {
	t.Helper()
	var got *amqp.Delivery
	deadline := time.Now().Add(30 * time.Second)
	for got == nil {
		testkit.WithChannel(t, func(ch *amqp.Channel) error {
			d, ok, err := ch.Get(h.queue, true)
			if ok {
				got = &d
			}
			return err
		})
		if got == nil {
			if time.Now().After(deadline) {
				t.Fatal("no message in the queue after 30s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return *got
}

// TestCloudEventsBinaryMode: with CloudEvents on, a published message
// decodes with the CloudEvents Go SDK (through the AMQP binding's binary
// mode) as a valid CloudEvent carrying the message's id, the configured
// source, its type, occurred_at to the nanosecond, its correlation id as
// subject, application/json and the payload; the Ordo message is intact.
func TestCloudEventsBinaryMode(t *testing.T) {
	h := newBroker(t, func(c *Config) { c.CloudEvents, c.CloudEventsSource = true, "/bookstore/orders" })
	at := time.Date(2026, 12, 1, 15, 4, 5, 123456789, time.FixedZone("x", 3600))
	m := relay.Message{ID: uuid.Must(uuid.NewV7()), Partition: 3, Epoch: 2, CorrelationID: "order-1", KeySeq: 4, PrevKeySeq: 3,
		Exchange: h.exchange, RoutingKey: "bound", Type: "bookstore.order-placed.v1",
		Payload: []byte(`{"orderId":"order-1"}`), OccurredAt: at, Headers: map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	res := newResults(t)
	h.publish(t, &m, res.settle(m.ID))
	if r := res.wait(m.ID, 1); r.Outcome != relay.Confirmed {
		t.Fatalf("outcome %v (%v), want confirmed", r.Outcome, r.Err)
	}
	d := h.getOne(t)
	ev, err := binding.ToEvent(context.Background(), ceDelivery{&d})
	if err != nil {
		t.Fatalf("decode as a CloudEvent: %v (headers %v)", err, d.Headers)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("not a valid CloudEvent: %v\n%v", err, ev)
	}
	for _, c := range []struct{ attr, got, want string }{
		{"specversion", ev.SpecVersion(), "1.0"},
		{"id", ev.ID(), m.ID.String()},
		{"source", ev.Source(), "/bookstore/orders"},
		{"type", ev.Type(), m.Type},
		{"subject", ev.Subject(), m.CorrelationID},
		{"datacontenttype", ev.DataContentType(), "application/json"},
		{"data", string(ev.Data()), string(m.Payload)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.attr, c.got, c.want)
		}
	}
	if !ev.Time().Equal(at) {
		t.Errorf("time = %v, want %v", ev.Time(), at)
	}
	if len(ev.Extensions()) != 0 {
		t.Errorf("extensions %v, want none", ev.Extensions())
	}
	if d.MessageId != m.ID.String() || d.CorrelationId != m.CorrelationID || d.Type != m.Type ||
		d.Headers[wire.HeaderKeySeq] != int64(4) || d.Headers["traceparent"] == nil {
		t.Errorf("the Ordo message changed: %+v", d)
	}
}

// TestCloudEventsOff: by default no cloudEvents: header is sent; with
// CloudEvents on, a row without a type fails as unsendable (it cannot be
// a CloudEvent) and nothing is sent.
func TestCloudEventsOff(t *testing.T) {
	h := newBroker(t, nil)
	m := h.Routable()
	m.ID = uuid.New()
	res := newResults(t)
	h.publish(t, &m, res.settle(m.ID))
	if r := res.wait(m.ID, 1); r.Outcome != relay.Confirmed {
		t.Fatalf("outcome %v (%v), want confirmed", r.Outcome, r.Err)
	}
	for k := range h.getOne(t).Headers {
		if strings.HasPrefix(k, wire.CloudEventsPrefix) {
			t.Errorf("CloudEvents off, yet header %s was sent", k)
		}
	}

	ce := newBroker(t, func(c *Config) { c.CloudEvents, c.CloudEventsSource = true, "urn:test" })
	m = ce.Routable()
	m.ID, m.Type = uuid.New(), ""
	res = newResults(t)
	ce.publish(t, &m, res.settle(m.ID))
	if r := res.wait(m.ID, 1); r.Outcome != relay.Failed || !errors.Is(r.Err, ErrUnsendable) {
		t.Fatalf("a row without a type: outcome %v (%v), want failed, unsendable", r.Outcome, r.Err)
	}
	if ids := ce.Received(t); len(ids) != 0 {
		t.Fatalf("sent %v, want nothing", ids)
	}
}

// TestCloudEventsConfig: CloudEvents need a source that is a URI-reference.
func TestCloudEventsConfig(t *testing.T) {
	for _, c := range []struct {
		name   string
		source string
		ok     bool
	}{
		{"path", "/bookstore/orders", true},
		{"urn", "urn:example:orders", true},
		{"url", "https://example.com/orders", true},
		{"empty", "", false},
		{"space", "/book store", false},
		{"bad escape", "/orders%zz", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.URL, cfg.CloudEvents, cfg.CloudEventsSource = "amqp://h/", true, c.source
			err := cfg.Validate()
			if got := confcheck.Fields(err); (len(got) == 0) != c.ok || (!c.ok && got[0] != "CloudEventsSource") {
				t.Fatalf("source %q: %v", c.source, err)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.URL = "amqp://h/"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("CloudEvents off needs no source: %v", err)
	}
}
