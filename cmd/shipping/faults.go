//go:build ordofaults

package main

import (
	"flag"
	"log/slog"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/inboxfaults"
)

// rig is the fault injection of the tests and the consumer nemesis
// (internal/inboxfaults): -handler-delay, -kill-after, -fault-error-rate,
// -fault-panic-rate and -fault-poison-prefix. Only a shipping built with
// the ordofaults build tag has it, as the tests and the bench build it;
// the default build's rig (nofaults.go) has no flags and injects nothing.
type rig struct{ inboxfaults.Config }

func (r *rig) addFlags(fs *flag.FlagSet) { r.Config.AddFlags(fs) }

func (r rig) validate() error { return r.Config.Validate() }

// wrap returns db and q with the faults injected.
func (r rig) wrap(db inbox.DB, q inbox.QueueHandler, logger *slog.Logger) (inbox.DB, inbox.QueueHandler) {
	return r.Config.WrapQueue(db, q, logger)
}
