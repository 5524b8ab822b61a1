package relaytest

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// The Store's notifications (relay.Notifications): which partitions are
// armed, the listeners they wake, and the knobs tests use to race them.

// notify wakes the listeners of partition, if it is armed, and disarms it;
// under NotifyEveryCommit it wakes them whatever is armed, and disarms
// nothing.
func (s *Store) notify(partition int) {
	s.mu.Lock()
	var wake []func(int)
	switch {
	case s.every:
		wake = slices.Clone(s.wake)
		s.woken++
	case s.armed[partition]:
		wake = slices.Clone(s.wake)
		s.woken++
		delete(s.armed, partition) // a notification disarms its partition
	}
	s.mu.Unlock()
	for _, w := range wake {
		w(partition)
	}
}

// NotifyEveryCommit makes every later commit notify its partition, armed
// or not, as an adopted table's intake does; the node stores then
// implement relay.EveryCommitNotified (a relay created after the call
// sees it).
func (s *Store) NotifyEveryCommit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.every = true
}

// EveryCommitNotifies implements relay.EveryCommitNotified.
func (n *NodeStore) EveryCommitNotifies() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.every
}

// DisarmCalls counts Disarm calls.
func (s *Store) DisarmCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.disarms
}

// Notifications counts the notifications sent to listeners (inserts into
// armed partitions).
func (s *Store) Notifications() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.woken
}

// SetBeforeArm makes every Arm call f first (nil: nothing), as if a
// producer committed between the relay's last read and its arm.
func (s *Store) SetBeforeArm(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onArm = f
}

// Listen implements relay.Notifications: it wakes once at once, then for every
// Insert into an armed partition, until ctx ends. Listening disarms every
// partition, as a reconnect does.
func (s *Store) Listen(ctx context.Context, wake func(partition int)) error {
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return nil
		}
	}
	s.mu.Lock()
	clear(s.armed)
	s.wake = append(s.wake, wake)
	n := len(s.wake) - 1
	s.listening++
	s.mu.Unlock()
	wake(-1)
	<-ctx.Done()
	s.mu.Lock()
	s.wake[n] = func(int) {}
	s.listening--
	s.mu.Unlock()
	return nil
}

// ErrNotListening is what Arm returns while no Listen is connected, as
// the real store's Arm fails then.
var ErrNotListening = errors.New("relaytest: not listening")

// HoldListen makes the Listen calls that start from now wait before they
// connect (as a slow connection to the database does) until release.
func (s *Store) HoldListen() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.held = ch
	s.mu.Unlock()
	return sync.OnceFunc(func() {
		s.mu.Lock()
		s.held = nil
		s.mu.Unlock()
		close(ch)
	})
}

// ArmCalls counts Arm calls, failed ones included.
func (s *Store) ArmCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arms
}

// Arm implements relay.Notifications. It refuses the partitions RefuseArm
// names, and fails with ErrNotListening while no Listen is connected.
func (s *Store) Arm(_ context.Context, partitions []int) ([]int, error) {
	s.mu.Lock()
	f := s.onArm
	s.arms++
	s.mu.Unlock()
	if f != nil {
		f()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listening == 0 {
		return nil, ErrNotListening
	}
	var armed []int
	for _, p := range partitions {
		if !s.refuse[p] {
			s.armed[p] = true
			armed = append(armed, p)
		}
	}
	return armed, nil
}

// Disarm implements relay.Notifications.
func (s *Store) Disarm(_ context.Context, partitions []int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disarms++
	for _, p := range partitions {
		delete(s.armed, p)
	}
	return nil
}

// RefuseArm makes Arm refuse partition p (on) or arm it again (off), as a
// producer's open transaction of p does in PostgreSQL.
func (s *Store) RefuseArm(p int, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse[p] = on
	if on {
		delete(s.armed, p)
	}
}

// Armed reports whether partition p is armed.
func (s *Store) Armed(p int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed[p]
}
