package inbox

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// fillFromCloudEvents takes the message id, type and correlation id of m
// from its CloudEvents attributes (id, type, subject) where the AMQP
// properties leave them empty, so a CloudEvent that carries the Ordo
// headers but not those properties is accepted like an Ordo message.
// The properties win where both are set.
func fillFromCloudEvents(m *Message, h amqp.Table) {
	for _, f := range []struct {
		dst    *string
		header string
	}{
		{&m.ID, wire.HeaderCloudEventsID},
		{&m.Type, wire.HeaderCloudEventsType},
		{&m.CorrelationID, wire.HeaderCloudEventsSubject},
	} {
		if *f.dst != "" {
			continue
		}
		if s, ok := h[f.header].(string); ok {
			*f.dst = s
		}
	}
}
