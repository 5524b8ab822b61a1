package node

import "time"

// PartitionStatus is one partition's lease and backlog, for /status, the
// cluster page and /metrics. It comes from the node's backlog snapshot
// (see Backlog), so it is at most a refresh interval old.
type PartitionStatus struct {
	Partition int        `json:"partition"`
	Owner     string     `json:"owner"`
	Epoch     int64      `json:"epoch"`
	Expires   *time.Time `json:"leaseExpires,omitempty"` // nil when free
	// LeaseLive reports whether a node holds an unexpired lease on the
	// partition, by the database's clock.
	LeaseLive bool `json:"leaseLive"`
	// Pending counts rows not yet processed, parked rows included, rows
	// held behind a parked row not (they wait for an operator with it).
	// Its rows that can go are counted exactly up to BacklogSampleRows;
	// above that it is an estimate and PendingEstimated is true.
	Pending          int64 `json:"pending"`
	PendingEstimated bool  `json:"pendingEstimated,omitempty"`
	// Parked counts parked rows (at most BacklogParkedCap).
	Parked int64 `json:"parked"`
	// OldestPendingSeconds is the age of the oldest pending row that is
	// neither parked nor held behind a parked row; 0 when there is none.
	OldestPendingSeconds float64 `json:"oldestPendingSeconds"`
}
