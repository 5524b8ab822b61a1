package inbox

import amqp "github.com/rabbitmq/amqp091-go"

// CloudEvents attributes of a message in the AMQP binding's binary content
// mode (a node run with -cloudevents sends them beside the Ordo headers;
// other producers may send only them). In AMQP 0-9-1 the binding's
// application properties are the headers.
const (
	HeaderCloudEventsID      = "cloudEvents:id"
	HeaderCloudEventsType    = "cloudEvents:type"
	HeaderCloudEventsSubject = "cloudEvents:subject"
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
		{&m.ID, HeaderCloudEventsID},
		{&m.Type, HeaderCloudEventsType},
		{&m.CorrelationID, HeaderCloudEventsSubject},
	} {
		if *f.dst != "" {
			continue
		}
		if s, ok := h[f.header].(string); ok {
			*f.dst = s
		}
	}
}
