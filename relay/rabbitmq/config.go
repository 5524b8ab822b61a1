package rabbitmq

import (
	"log/slog"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/internal/redact"
)

// Config configures a Publisher. Start from DefaultConfig, set URL,
// change what needs changing, and hand it to New, which gives every zero
// field (but StallTimeout) its DefaultConfig value and then calls
// Validate.
type Config struct {
	// URL is the broker, e.g. amqp://guest:guest@127.0.0.1:5672/, or a
	// comma-separated list of broker nodes: Run dials them in turn and,
	// after a failed dial or a lost connection, moves on to the next.
	// Required; there is no default. Percent-encode reserved characters
	// (@ : / ? # %) in the user name and password.
	URL string

	// Window is the most unconfirmed messages the relay keeps in flight
	// (relay.Config.Window); it sizes the confirm and return buffers so
	// the client library never has to drop a notification. 1..65535; the
	// default is 512. Always set it to the relay's Window.
	Window int

	// ReconnectMin and ReconnectMax bound the capped exponential backoff
	// between connection attempts. The defaults are 100 ms and 1 s; a
	// longer ReconnectMax spares a broker that is starting up, at the cost
	// of noticing later that it is back.
	ReconnectMin, ReconnectMax time.Duration

	// StableAfter is how long a connection must stay up, with a publish
	// confirmed on it, before the reconnect backoff starts over: a
	// connection the broker closes at once (over a message it refuses)
	// keeps backing off. The default is 1 s.
	StableAfter time.Duration

	// ExchangeCheckTTL is how long a passive declare proving an exchange
	// exists is trusted before the exchange is checked again. The default
	// is 10 s. A shorter TTL notices a deleted exchange sooner (until then
	// a publish to it closes the channel) at the cost of more declares.
	ExchangeCheckTTL time.Duration

	// Heartbeat is the AMQP heartbeat interval; a silent broker is noticed
	// within about one and a half of them. The default is 5 s.
	Heartbeat time.Duration

	// ConfirmTimeout is how long a publish may wait for its confirm on a
	// channel that stays open; past it the message is relay.Failed (an
	// attempt for its key), and a confirm that comes later is ignored. The
	// clock does not run while the broker blocks the connection. The
	// default is 30 s; lower it only for a broker known to confirm fast,
	// since a slow confirm then costs its key an attempt.
	ConfirmTimeout time.Duration

	// StallTimeout: when publishes have waited this long and no confirm at
	// all has come meanwhile, the link is taken for dead (a blackholed
	// network the heartbeat has not noticed yet): the connection is closed,
	// its messages are relay.Unsent, and it is dialled again. Not while
	// the broker blocks the connection. The default, 0, turns it off; the
	// node sets it to the lease TTL.
	StallTimeout time.Duration

	// CallTimeout bounds every call that waits for the broker's answer
	// (opening a channel, confirm mode, a passive declare, closing). A
	// broker under a resource alarm stops reading the socket, and such a
	// call would wait forever; past CallTimeout the connection is closed.
	// The default is 5 s.
	CallTimeout time.Duration

	// Logger receives connection and outage messages; nil means
	// slog.Default().
	Logger *slog.Logger

	// ConnectionName, when set, is sent as the connection_name client
	// property: rabbitmqctl list_connections client_properties and the
	// management UI show it, so an operator can find this connection.
	ConnectionName string

	// CloudEvents publishes every message as a CloudEvent in the AMQP
	// binding's binary content mode (cloudevents.go): the message as it
	// is, plus the headers cloudEvents:specversion, id (the message id),
	// source (CloudEventsSource), type, time (occurred_at) and subject
	// (the correlation id). Consumers that ignore them see the same Ordo
	// message. Off by default. A row with an empty type cannot be a
	// CloudEvent: it fails, and is parked like any unsendable row.
	CloudEvents bool

	// CloudEventsSource is the CloudEvents source attribute (a
	// URI-reference naming the producer, e.g. /bookstore/orders); required
	// with CloudEvents, and only used then.
	CloudEventsSource string
}

// DefaultConfig returns the defaults: every field but URL (required) and
// Logger (slog.Default()).
func DefaultConfig() Config {
	return Config{
		Window:           512,
		ReconnectMin:     100 * time.Millisecond,
		ReconnectMax:     time.Second,
		StableAfter:      time.Second,
		ExchangeCheckTTL: 10 * time.Second,
		Heartbeat:        5 * time.Second,
		ConfirmTimeout:   30 * time.Second,
		CallTimeout:      5 * time.Second,
	}
}

// withDefaults returns c with every zero field but StallTimeout set to
// its DefaultConfig value.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	confcheck.Fill(&c.Window, d.Window)
	confcheck.Fill(&c.ReconnectMin, d.ReconnectMin)
	confcheck.Fill(&c.ReconnectMax, d.ReconnectMax)
	confcheck.Fill(&c.StableAfter, d.StableAfter)
	confcheck.Fill(&c.ExchangeCheckTTL, d.ExchangeCheckTTL)
	confcheck.Fill(&c.Heartbeat, d.Heartbeat)
	confcheck.Fill(&c.ConfirmTimeout, d.ConfirmTimeout)
	confcheck.Fill(&c.CallTimeout, d.CallTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every unusable setting of c as it stands (it does not
// fill zero fields, as New does), joined; each is a *confcheck.Problem
// naming its field. A URL that does not parse is reported with its
// password masked.
func (c Config) Validate() error {
	ck := confcheck.New("rabbitmq")
	ck.Require(c.URL != "", "URL", "is empty; the broker's URL is required")
	if c.URL != "" {
		for _, u := range strings.Split(c.URL, ",") {
			// The parse error quotes the whole URL, password included.
			_, err := amqp.ParseURI(strings.TrimSpace(u))
			ck.Require(err == nil, "URL", "%s does not parse: percent-encode reserved characters (@ : / ? # %%) in the user name and password", redact.URL(u))
		}
	}
	ck.Require(c.Window >= 1 && c.Window <= 65535, "Window", "%d is out of range 1..65535", c.Window)
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"ReconnectMin", c.ReconnectMin}, {"StableAfter", c.StableAfter}, {"ExchangeCheckTTL", c.ExchangeCheckTTL},
		{"Heartbeat", c.Heartbeat}, {"ConfirmTimeout", c.ConfirmTimeout}, {"CallTimeout", c.CallTimeout},
	} {
		ck.Require(d.v > 0, d.field, "%v is not positive", d.v)
	}
	ck.Require(c.ReconnectMax >= c.ReconnectMin, "ReconnectMax", "%v is below ReconnectMin (%v)", c.ReconnectMax, c.ReconnectMin)
	if c.CloudEvents {
		msg := checkCloudEventsSource(c.CloudEventsSource)
		ck.Require(msg == "", "CloudEventsSource", "%s", msg)
	}
	ck.Require(c.StallTimeout >= 0, "StallTimeout", "%v is negative (0 turns it off)", c.StallTimeout)
	return ck.Err()
}
