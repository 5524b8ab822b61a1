package relaytest

import (
	"fmt"

	"github.com/ordo-relay/ordo/relay"
)

// CheckOrder checks delivered messages (as a consumer received them)
// against the per-key rule: the first delivery of each key's messages
// comes in key_seq order, each one's x-ordo-prev-key-seq naming the one
// before. Later deliveries of a message already seen are duplicates, which
// at-least-once allows. It returns the first violation, or nil.
func CheckOrder(delivered []relay.Message) error {
	last := map[string]int64{}
	for _, m := range delivered {
		seen, ok := last[m.CorrelationID]
		if ok && m.KeySeq <= seen {
			continue // duplicate
		}
		if m.PrevKeySeq != seen {
			return fmt.Errorf("key %q: key_seq %d (prev %d) delivered after %d", m.CorrelationID, m.KeySeq, m.PrevKeySeq, seen)
		}
		last[m.CorrelationID] = m.KeySeq
	}
	return nil
}
