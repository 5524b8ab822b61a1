package inbox

// SetDeadLetterURL makes c publish its dead letters to the broker at url
// (a test proxy in front of it) instead of Config.AMQPURL. Call it before
// Run.
func SetDeadLetterURL(c *Consumer, url string) { c.dead.url = url }
