package tablesource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/relay"
)

// Wake-ups. The only writer of ordo_table_rows is the intake, Ordo's
// own, so it notifies every page it takes in, with the page's partitions
// as the payload (comma-separated): one NOTIFY per page, in no
// producer's transaction. The relays listen and read a partition when it
// is notified (relay.EveryCommitNotified), instead of polling every
// partition every few milliseconds while rows arrive. An operator's
// retry notifies the same channel.

// ErrNotListening is returned by Arm while Listen is not connected.
var ErrNotListening = errors.New("adopted table listener not connected")

// NotifyChannel returns the channel on which the intake of the table l
// maps, and an operator's retry of its rows, notify their partitions.
func NotifyChannel(l Layout) string {
	return fmt.Sprintf("ordo_table_%016x", xxhash.Sum64String(l.QuotedTable()))
}

// notifyPayloadMax bounds one notification's payload (PostgreSQL's limit
// is 8,000 bytes): a page naming more partitions sends several.
const notifyPayloadMax = 7000

// notifyPayloads returns the partitions of rows as notification payloads,
// each a comma-separated list of at most notifyPayloadMax bytes.
func notifyPayloads(rows []Row) []string {
	seen := make(map[int]bool, len(rows))
	var (
		out []string
		b   strings.Builder
	)
	for _, r := range rows {
		if seen[r.Partition] {
			continue
		}
		seen[r.Partition] = true
		p := strconv.Itoa(r.Partition)
		if b.Len() > 0 && b.Len()+1+len(p) > notifyPayloadMax {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// listenPing is how long Listen waits for a notification before it asks
// the server whether the connection still works.
const listenPing = 5 * time.Second

// EveryCommitNotifies implements relay.EveryCommitNotified: every page
// the intake takes in notifies its partitions.
func (s *Store) EveryCommitNotifies() bool { return true }

// Listen implements relay.Notifications: it listens on NotifyChannel on
// a connection of its own and calls wake with each partition a
// notification names, and with -1 after each (re)connect, until ctx ends.
func (s *Store) Listen(ctx context.Context, wake func(partition int)) error {
	down := outage.New(s.logger, "PostgreSQL listener (adopted table)")
	bo := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		listened, err := s.listenOnce(ctx, wake, down)
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			bo.Reset()
		}
		down.Fail(err)
		if !backoff.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
}

func (s *Store) listenOnce(ctx context.Context, wake func(int), down *outage.Log) (listened bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, s.pool.Config().ConnConfig.Copy())
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{NotifyChannel(s.layout)}.Sanitize()); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	down.OK()
	s.listening.Store(true)
	defer s.listening.Store(false)
	wake(-1) // notifications sent while nobody listened are gone: read everything once
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
		n, err := conn.WaitForNotification(wctx)
		idle := errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		switch {
		case idle:
			// Nothing for a while: make sure the connection still works,
			// so that a dead one is replaced (the relay's safety poll
			// reads every partition meanwhile).
			pctx, cancel := context.WithTimeout(ctx, listenPing)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("ping: %w", err)
			}
			continue
		case err != nil:
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		for _, f := range strings.Split(n.Payload, ",") {
			// A payload that is not a partition is not ours: ignored.
			if p, err := strconv.Atoi(f); err == nil && p >= 0 {
				wake(p)
			}
		}
	}
}

// Arm implements relay.Notifications: every commit notifies, so every
// partition is armed while Listen is connected.
func (s *Store) Arm(_ context.Context, partitions []int) ([]int, error) {
	if !s.listening.Load() {
		return nil, ErrNotListening
	}
	return partitions, nil
}

// Disarm implements relay.Notifications: there is nothing to undo.
func (s *Store) Disarm(context.Context, []int) error { return nil }

var _ relay.EveryCommitNotified = (*Store)(nil)
