package relay

// ReadWaits returns how many times the read loop has waited for
// something to read (waitRead): a loop that spins instead of waiting
// shows here.
func (r *Relay) ReadWaits() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wake.readWaits
}

// RefusedArms returns how many arms in a row left a partition unarmed.
func (r *Relay) RefusedArms() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wake.refused
}
