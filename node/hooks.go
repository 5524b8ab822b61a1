package node

import "github.com/ordo-relay/ordo/relay"

// relayConfig applies the test hooks of o to the relay's configuration.
func (o Options) relayConfig(rc relay.Config) relay.Config {
	rc.TracerProvider = o.TracerProvider
	if o.PerKeyLimit > 0 {
		rc.PerKeyLimit = o.PerKeyLimit
	}
	return rc
}
