package inbox

import "time"

// SetDeadLetterURL makes c publish its dead letters to the broker at url
// (a test proxy in front of it) instead of Config.AMQPURL. Call it before
// Run.
func SetDeadLetterURL(c *Consumer, url string) { c.dead.url = url }

// LocalConfig is DefaultConfig with short timings for tests.
func LocalConfig(name string) Config {
	c := DefaultConfig(name)
	c.LeaseTTL = 2 * time.Second
	c.RetryMin = 20 * time.Millisecond
	c.RetryMax = 500 * time.Millisecond
	c.RetryPoll = 50 * time.Millisecond
	c.GapWait = 2 * time.Second
	c.Heartbeat = 2 * time.Second
	return c
}

// SQLClaimShards is the claim statement: $1 consumer, $2 instance,
// $3 TTL (seconds), $4 shards.
const SQLClaimShards = sqlClaimShards
