package rabbitmq

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/relay"
)

// CloudEvents (https://cloudevents.io), AMQP protocol binding 1.0, binary
// content mode: the payload is the event's data, the content-type
// property (application/json) its datacontenttype, and every other
// attribute an application property named with the binding's prefix. In
// AMQP 0-9-1, application properties are the message headers.
const (
	// CloudEventsPrefix prefixes the header of every CloudEvents attribute.
	CloudEventsPrefix = "cloudEvents:"

	HeaderCloudEventsSpecVersion = CloudEventsPrefix + "specversion" // "1.0"
	HeaderCloudEventsID          = CloudEventsPrefix + "id"          // the message id
	HeaderCloudEventsSource      = CloudEventsPrefix + "source"      // Config.CloudEventsSource
	HeaderCloudEventsType        = CloudEventsPrefix + "type"        // the row's type
	HeaderCloudEventsTime        = CloudEventsPrefix + "time"        // occurred_at, RFC 3339
	HeaderCloudEventsSubject     = CloudEventsPrefix + "subject"     // the correlation id

	// CloudEventsSpecVersion is the CloudEvents version the headers follow.
	CloudEventsSpecVersion = "1.0"
)

// errCloudEventType is why a row without a type cannot be a CloudEvent
// (type is a required, non-empty attribute).
var errCloudEventType = errors.New("a CloudEvent needs a type, and the row's type is empty")

// addCloudEvents adds m's CloudEvents attributes to h. The time goes as
// the canonical string form (RFC 3339, UTC, nanoseconds), which the
// binding allows beside the native timestamp: an AMQP 0-9-1 timestamp
// holds whole seconds only.
func addCloudEvents(h amqp.Table, m *relay.Message, source string) {
	h[HeaderCloudEventsSpecVersion] = CloudEventsSpecVersion
	h[HeaderCloudEventsID] = m.ID.String()
	h[HeaderCloudEventsSource] = source
	h[HeaderCloudEventsType] = m.Type
	h[HeaderCloudEventsTime] = m.OccurredAt.UTC().Format(time.RFC3339Nano)
	h[HeaderCloudEventsSubject] = m.CorrelationID
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
