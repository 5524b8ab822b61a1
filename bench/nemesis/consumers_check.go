package nemesis

import (
	"fmt"
	"sort"

	"github.com/ordo-relay/ordo/inbox"
)

// committedRow is an outbox row of the run: what the consumers owe.
type committedRow struct {
	ID     string
	Key    string
	KeySeq int64
}

// handledRow is a shipping_events row: one handler transaction committed,
// in commit order per key (N is drawn inside the transaction, which holds
// its key's inbox row lock until it commits).
type handledRow struct {
	N         int64
	Key       string
	KeySeq    int64
	MessageID string
}

// consumerState is what the checker reads from the shipping database at
// the end, besides the projection.
type consumerState struct {
	Dead    []inbox.DeadMessage
	Stuck   []inbox.StuckKey
	LastSeq map[string]int64 // ordo_inbox_keys.last_seq of the poison keys
}

// consumerVerdict is the consumer checker's finding.
type consumerVerdict struct {
	Committed      int // outbox rows of the run
	Handled        int // shipping_events rows
	Keys           int
	HandledTwice   int // a (key, key_seq) handled again
	Lost           int // a committed row never handled, and not held behind a poison order's dead letter
	OutOfOrder     int // a first handling whose key_seq is below one already handled for its key
	Dead           int // dead-lettered messages
	UnexpectedDead int // dead-lettered messages that are not a poison order's
	PoisonUnheld   int // a poison order not dead-lettered, or a message of its key handled or not waiting behind it
	Stuck          int // keys waiting for a predecessor at the end
	Problems       []string
}

// OK reports whether the consumers kept their promises.
func (v consumerVerdict) OK() bool {
	return v.HandledTwice == 0 && v.Lost == 0 && v.OutOfOrder == 0 && v.UnexpectedDead == 0 &&
		v.PoisonUnheld == 0 && v.Stuck == 0
}

func (v *consumerVerdict) problem(format string, args ...any) {
	if len(v.Problems) < problemCap {
		v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
	}
}

type keySeq struct {
	key string
	seq int64
}

// checkConsumers judges the consumers from the rows alone:
//
//   - handled twice: a (key, key_seq) in the projection more than once;
//   - out of order: per key, in commit order, a first handling whose
//     key_seq is below one handled before it;
//   - lost: a committed row never handled, unless it is a poison order's
//     row or behind one (poison maps each poison key to its poison row's
//     key_seq);
//   - dead: every dead-lettered message; unexpected when it is not a
//     poison row;
//   - poison unheld: a poison row not dead-lettered, a row of its key at
//     or after it handled, the key's last handled key_seq at or past it,
//     or fewer of its key's later rows waiting behind it than committed;
//   - stuck: keys whose stored message waits for a predecessor.
func checkConsumers(committed []committedRow, handled []handledRow, st consumerState, poison map[string]int64) consumerVerdict {
	v := consumerVerdict{Committed: len(committed), Handled: len(handled), Dead: len(st.Dead), Stuck: len(st.Stuck)}
	sort.Slice(handled, func(i, j int) bool { return handled[i].N < handled[j].N })
	seen := map[keySeq]bool{}
	high := map[string]int64{}
	for _, h := range handled {
		ks := keySeq{h.Key, h.KeySeq}
		if seen[ks] {
			v.HandledTwice++
			v.problem("handled twice: key %s key_seq %d (message %s, event %d)", h.Key, h.KeySeq, h.MessageID, h.N)
			continue
		}
		seen[ks] = true
		if h.KeySeq < high[h.Key] {
			v.OutOfOrder++
			v.problem("out of order: key %s key_seq %d handled after key_seq %d (event %d)", h.Key, h.KeySeq, high[h.Key], h.N)
		}
		high[h.Key] = max(high[h.Key], h.KeySeq)
		if ps, ok := poison[h.Key]; ok && h.KeySeq >= ps {
			v.PoisonUnheld++
			v.problem("poison: key %s key_seq %d was handled (the poison row is key_seq %d)", h.Key, h.KeySeq, ps)
		}
	}
	v.Keys = len(high)
	behind := map[string]int{} // poison key -> its committed rows after the poison row
	for _, c := range committed {
		if ps, ok := poison[c.Key]; ok && c.KeySeq >= ps {
			if c.KeySeq > ps {
				behind[c.Key]++
			}
			continue
		}
		if !seen[keySeq{c.Key, c.KeySeq}] {
			v.Lost++
			v.problem("lost: key %s key_seq %d (message %s) was committed and never handled", c.Key, c.KeySeq, c.ID)
		}
	}
	dead := map[keySeq]inbox.DeadMessage{}
	for _, d := range st.Dead {
		dead[keySeq{d.Key, d.KeySeq}] = d
		if ps, ok := poison[d.Key]; !ok || d.KeySeq != ps {
			v.UnexpectedDead++
			v.problem("unexpected dead letter: key %s key_seq %d after %d attempts: %s", d.Key, d.KeySeq, d.Attempts, d.LastError)
		}
	}
	keys := make([]string, 0, len(poison))
	for k := range poison {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ps := poison[k]
		d, ok := dead[keySeq{k, ps}]
		switch {
		case !ok:
			v.PoisonUnheld++
			v.problem("poison: key %s key_seq %d is not dead-lettered", k, ps)
		case d.Waiting < behind[k]:
			v.PoisonUnheld++
			v.problem("poison: key %s: %d of its later rows wait behind the dead letter, %d were committed", k, d.Waiting, behind[k])
		}
		if last := st.LastSeq[k]; last >= ps {
			v.PoisonUnheld++
			v.problem("poison: key %s moved past its dead letter (last_seq %d, poison key_seq %d)", k, last, ps)
		}
	}
	for _, s := range st.Stuck {
		v.problem("stuck: key %s waits for key_seq %d..%d since %s", s.Key, s.Last+1, s.Prev, s.Since.Format("15:04:05.000"))
	}
	return v
}

// consumersLine is the consumer run's last line.
func consumersLine(profile string, seed int64, v consumerVerdict, p50, worst float64) string {
	return fmt.Sprintf("RESULT scenario=nemesis-consumers profile=%s seed=%d handled_twice=%d lost=%d out_of_order=%d dead=%d unexpected_dead=%d poison_unheld=%d stuck=%d recovery_p50_s=%.2f recovery_max_s=%.2f",
		profile, seed, v.HandledTwice, v.Lost, v.OutOfOrder, v.Dead, v.UnexpectedDead, v.PoisonUnheld, v.Stuck, p50, worst)
}
