//go:build !ordofaults

package main

import (
	"flag"
	"log/slog"

	"github.com/ordo-relay/ordo/inbox"
)

// rig is empty in the default build: shipping has no fault injection and
// no flags for it. The tests and the consumer nemesis build it with the
// ordofaults build tag, whose rig (faults.go) injects faults.
type rig struct{}

func (*rig) addFlags(*flag.FlagSet) {}

func (rig) validate() error { return nil }

// wrap returns db and q as they are.
func (rig) wrap(db inbox.DB, q inbox.QueueHandler, _ *slog.Logger) (inbox.DB, inbox.QueueHandler) {
	return db, q
}
