package rabbitmq

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/wire"
)

// errCloudEventType is why a row without a type cannot be a CloudEvent
// (type is a required, non-empty attribute).
var errCloudEventType = errors.New("a CloudEvent needs a type, and the row's type is empty")

// addCloudEvents adds m's CloudEvents attributes to h: CloudEvents
// (https://cloudevents.io), AMQP protocol binding 1.0, binary content mode,
// where the payload is the event's data, the content-type property
// (application/json) its datacontenttype, and every other attribute an
// application property (in AMQP 0-9-1, a header) named with the binding's
// prefix (package wire's HeaderCloudEvents*). The time goes as
// the canonical string form (RFC 3339, UTC, nanoseconds), which the
// binding allows beside the native timestamp: an AMQP 0-9-1 timestamp
// holds whole seconds only.
func addCloudEvents(h amqp.Table, m *relay.Message, source string) {
	h[wire.HeaderCloudEventsSpecVersion] = wire.CloudEventsSpecVersion
	h[wire.HeaderCloudEventsID] = m.ID.String()
	h[wire.HeaderCloudEventsSource] = source
	h[wire.HeaderCloudEventsType] = m.Type
	h[wire.HeaderCloudEventsTime] = m.OccurredAt.UTC().Format(time.RFC3339Nano)
	h[wire.HeaderCloudEventsSubject] = m.CorrelationID
}

// checkCloudEventsSource says why s cannot be a CloudEvents source (a
// non-empty URI-reference), or returns "".
func checkCloudEventsSource(s string) string {
	if s == "" {
		return "is empty; CloudEvents need a source (a URI-reference such as /bookstore/orders or urn:example:orders)"
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return fmt.Sprintf("%q contains white space; it must be a URI-reference", s)
	}
	if _, err := url.Parse(s); err != nil {
		return fmt.Sprintf("%q is not a URI-reference: %v", s, err)
	}
	return ""
}
