package node

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The labels of the per-source families: every source the node relays
// has its own series, named by its source (docs/design.md, "Sources").
var (
	srcLabel   = []string{"source"}
	partLabels = []string{"partition", "source"}
)

// The node's metrics that are read at scrape time. docs/operations.md lists
// every metric; keep it in step (TestMetricsDocumented checks).
var (
	descPartitions = prometheus.NewDesc("ordo_partitions",
		"Partition count P.", srcLabel, nil)
	descAssigned = prometheus.NewDesc("ordo_partitions_assigned",
		"Partitions this node's view of the membership assigns to it.", srcLabel, nil)
	descHeld = prometheus.NewDesc("ordo_partitions_held",
		"Partitions whose lease this node holds (valid local deadline).", srcLabel, nil)
	descPending = prometheus.NewDesc("ordo_partition_pending",
		"Pending rows of a partition, parked ones included (estimated above the sample size; see docs/operations.md).", partLabels, nil)
	descParked = prometheus.NewDesc("ordo_partition_parked",
		"Parked rows of a partition.", partLabels, nil)
	descOldest = prometheus.NewDesc("ordo_partition_oldest_pending_age_seconds",
		"Age of the oldest pending, not parked, row of a partition; 0 when none.", partLabels, nil)
	descLeaseLive = prometheus.NewDesc("ordo_partition_lease_live",
		"1 when some node holds an unexpired lease on the partition (database clock), else 0.", partLabels, nil)
	descBacklogAge = prometheus.NewDesc("ordo_backlog_snapshot_age_seconds",
		"Seconds since the backlog snapshot the partition metrics come from was taken (since the node started, before the first).", srcLabel, nil)
	descBacklogAvailable = prometheus.NewDesc("ordo_backlog_available",
		"1 while the backlog snapshot is fresh (refreshed within 3 intervals + 2 s); 0 while the partition metrics are stale or missing.", srcLabel, nil)
	descBacklogRefreshes = prometheus.NewDesc("ordo_backlog_refreshes_total",
		"Backlog snapshot queries run.", srcLabel, nil)
	descBacklogFailures = prometheus.NewDesc("ordo_backlog_refresh_failures_total",
		"Backlog snapshot queries that failed.", srcLabel, nil)
	descBacklogDuration = prometheus.NewDesc("ordo_backlog_refresh_duration_seconds",
		"Duration of the last backlog snapshot query.", srcLabel, nil)

	descMarked = prometheus.NewDesc("ordo_messages_marked_total",
		"Confirmed messages marked processed.", srcLabel, nil)
	descRelayFailures = prometheus.NewDesc("ordo_message_failures_recorded_total",
		"Failed attempts recorded against messages (nacked, returned, failed).", srcLabel, nil)
	descParkedTotal = prometheus.NewDesc("ordo_messages_parked_total",
		"Messages this node parked after -max-attempts failures.", srcLabel, nil)
	descRefused = prometheus.NewDesc("ordo_marks_refused_total",
		"Marks refused because the partition's lease moved (the rows stay pending).", srcLabel, nil)
	descDeleted = prometheus.NewDesc("ordo_retention_deleted_total",
		"Processed rows deleted by retention.", srcLabel, nil)
	descReads = prometheus.NewDesc("ordo_relay_reads_total",
		"Reads of pending rows.", srcLabel, nil)
	descReadRows = prometheus.NewDesc("ordo_relay_read_rows_total",
		"Rows returned by reads (÷ ordo_relay_reads_total: the read batch size).", srcLabel, nil)
	descReadSeconds = prometheus.NewDesc("ordo_relay_read_seconds_total",
		"Time spent in reads (÷ ordo_relay_reads_total: the mean read duration).", srcLabel, nil)
	descMarks = prometheus.NewDesc("ordo_relay_marks_total",
		"Mark statements (confirmed ÷ marks: the mark batch size).", srcLabel, nil)
	descMarkSeconds = prometheus.NewDesc("ordo_relay_mark_seconds_total",
		"Time spent in mark statements.", srcLabel, nil)
	descIdleReads = prometheus.NewDesc("ordo_relay_idle_reads_total",
		"Reads that returned rows none of which could be published.", srcLabel, nil)
	descLeaseSkipped = prometheus.NewDesc("ordo_relay_lease_skipped_total",
		"Rows read but not published because their lease lapsed or moved during the read.", srcLabel, nil)
	descStalled = prometheus.NewDesc("ordo_relay_stalled_seconds",
		"How long the relay has gone without publishing while reads fail or return rows it cannot publish; 0 while it makes progress.", srcLabel, nil)
	descInFlight = prometheus.NewDesc("ordo_relay_in_flight",
		"Messages published and not yet marked, or backing off.", srcLabel, nil)
	descUnconfirmed = prometheus.NewDesc("ordo_relay_unconfirmed",
		"Messages published and not yet confirmed (at most the confirm window W).", srcLabel, nil)
	descWindow = prometheus.NewDesc("ordo_relay_confirm_window",
		"The confirm window W.", srcLabel, nil)

	descBudgetSlots = prometheus.NewDesc("ordo_budget_slots",
		"The node's confirm window W, shared by its sources' relays.", nil, nil)
	descBudgetSlotsUsed = prometheus.NewDesc("ordo_budget_slots_used",
		"Slots of W taken: messages published and not yet marked, over every source.", nil, nil)
	descBudgetBytes = prometheus.NewDesc("ordo_budget_bytes",
		"The node's read-ahead budget in bytes (-read-ahead-bytes), shared by its sources' relays.", nil, nil)
	descBudgetBytesUsed = prometheus.NewDesc("ordo_budget_bytes_used",
		"Bytes of the read-ahead budget taken: rows read ahead and in flight, over every source.", nil, nil)
	descBudgetSourceSlots = prometheus.NewDesc("ordo_budget_source_slots_used",
		"Slots of W a source's relay has taken.", srcLabel, nil)
	descBudgetSourceBytes = prometheus.NewDesc("ordo_budget_source_bytes_used",
		"Bytes of the read-ahead budget a source's relay has taken.", srcLabel, nil)

	descClaims = prometheus.NewDesc("ordo_lease_claims_total",
		"Partition leases claimed.", srcLabel, nil)
	descRenewFailures = prometheus.NewDesc("ordo_lease_renewal_failures_total",
		"Lease renewal rounds that failed (database unreachable or slow).", srcLabel, nil)
	descLosses = prometheus.NewDesc("ordo_lease_losses_total",
		"Leases a renewal found held by another node or epoch.", srcLabel, nil)
	descHandoffs = prometheus.NewDesc("ordo_lease_handoffs_total",
		"Leases released because the partition was assigned elsewhere.", srcLabel, nil)
	descHandoffTimeouts = prometheus.NewDesc("ordo_lease_handoff_timeouts_total",
		"Handoffs that released the lease before the partition's in-flight messages settled.", srcLabel, nil)
	descRebalances = prometheus.NewDesc("ordo_rebalances_total",
		"Changes of the set of partitions assigned to this node.", srcLabel, nil)

	descBrokerUp = prometheus.NewDesc("ordo_broker_connected",
		"1 while the publisher has an open channel to the broker.", nil, nil)
	descBrokerBlocked = prometheus.NewDesc("ordo_broker_blocked",
		"1 while the broker blocks the connection (connection.blocked: memory or disk alarm).", nil, nil)
	descDatabaseUp = prometheus.NewDesc("ordo_database_reachable",
		"1 while the node reaches PostgreSQL (its health ping succeeded within the lease TTL minus its margin).", srcLabel, nil)
	descMembers = prometheus.NewDesc("ordo_gossip_members",
		"Live gossip members this node sees (itself included).", nil, nil)
	descMembersGone = prometheus.NewDesc("ordo_gossip_members_gone",
		"Members this node saw leave or declared dead.", nil, nil)
	descDegraded = prometheus.NewDesc("ordo_degraded",
		"1 while the node is degraded (oldest pending age in its partitions above -degraded-after, broker blocked, or a peer disagrees on a source's database).", nil, nil)
	descConflicts = prometheus.NewDesc("ordo_source_identity_conflicts",
		"Live peers that disagree with this node on the source's database (another database under its name, or its database under another name); each is left out of the source's map on this node.", srcLabel, nil)
	descTableLateRows = prometheus.NewDesc("ordo_table_late_rows_total",
		"Rows of an adopted table this node numbered after a later row of their key (committed late, or a producer's clock behind); exported for sources with a table layout only.", srcLabel, nil)
)

// collector is the node's prometheus.Collector: every value is read from
// the running components at scrape time.
type collector struct{ v *view }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descPartitions, descAssigned, descHeld, descPending, descParked, descOldest, descLeaseLive,
		descBacklogAge, descBacklogAvailable, descBacklogRefreshes, descBacklogFailures, descBacklogDuration,
		descMarked, descRelayFailures, descParkedTotal, descRefused, descDeleted, descReads, descIdleReads,
		descReadRows, descReadSeconds, descMarks, descMarkSeconds,
		descLeaseSkipped, descStalled, descInFlight, descUnconfirmed, descWindow,
		descBudgetSlots, descBudgetSlotsUsed, descBudgetBytes, descBudgetBytesUsed, descBudgetSourceSlots, descBudgetSourceBytes,
		descClaims, descRenewFailures, descLosses, descHandoffs, descHandoffTimeouts, descRebalances,
		descBrokerUp, descBrokerBlocked, descDatabaseUp, descMembers, descMembersGone, descDegraded, descConflicts,
		descTableLateRows,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	conflicts := map[string]int{} // peers in conflict, by source
	seen := map[[2]string]bool{}
	for _, x := range c.v.conflicts() {
		if !seen[[2]string{x.Source, x.Peer}] {
			seen[[2]string{x.Source, x.Peer}] = true
			conflicts[x.Source]++
		}
	}
	for _, s := range c.v.srcs {
		c.collectSource(ch, s)
		ch <- prometheus.MustNewConstMetric(descConflicts, prometheus.GaugeValue, float64(conflicts[s.name]), s.name)
	}
	v := c.v
	gauge := func(d *prometheus.Desc, x float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x)
	}
	gauge(descBrokerUp, b2f(v.broker.Connected()))
	gauge(descBrokerBlocked, b2f(v.broker.State().Blocked != ""))
	alive, gone := 0, 0
	for _, m := range v.memberList() {
		if m.State == "alive" {
			alive++
		} else {
			gone++
		}
	}
	gauge(descMembers, float64(alive))
	gauge(descMembersGone, float64(gone))
	gauge(descDegraded, b2f(v.degradation().Degraded))
	c.collectBudget(gauge)
}

// collectBudget exports the node's Budget: W and the read-ahead bytes its
// sources' relays share, and what they use of them. With one source there
// is no Budget, and they are that source's relay's own.
func (c collector) collectBudget(gauge func(*prometheus.Desc, float64)) {
	v := c.v
	if v.budget != nil {
		st := v.budget.Stats()
		gauge(descBudgetSlots, float64(st.Window))
		gauge(descBudgetSlotsUsed, float64(st.InFlight))
		gauge(descBudgetBytes, float64(st.Bytes))
		gauge(descBudgetBytesUsed, float64(st.BytesUsed))
		return
	}
	var slots int
	var bytes int64
	for _, s := range v.srcs {
		st := s.relay.Stats()
		slots += st.InFlight
		bytes += st.ReadAheadBytes
	}
	gauge(descBudgetSlots, float64(v.cfg.Relay.Window))
	gauge(descBudgetSlotsUsed, float64(slots))
	gauge(descBudgetBytes, float64(v.cfg.Relay.ReadAheadBytes))
	gauge(descBudgetBytesUsed, float64(bytes))
}

// collectSource exports the families of one source, each series labelled
// with its name.
func (c collector) collectSource(ch chan<- prometheus.Metric, src *source) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(labels, src.name)...)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), src.name)
	}
	counterF := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, src.name)
	}
	v := c.v
	gauge(descPartitions, float64(src.partitions))
	gauge(descAssigned, float64(len(v.assignment(src).Owned(v.cfg.NodeName))))
	gauge(descHeld, float64(len(v.held(src))))
	c.collectBacklog(src, gauge, counter)

	s := src.relay.Stats()
	counter(descMarked, s.Marked)
	counter(descRelayFailures, s.Failed)
	counter(descParkedTotal, s.Parked)
	counter(descRefused, s.Refused)
	counter(descDeleted, s.Deleted)
	counter(descReads, s.Reads)
	counter(descReadRows, s.ReadRows)
	counterF(descReadSeconds, s.ReadSeconds)
	counter(descMarks, s.Marks)
	counterF(descMarkSeconds, s.MarkSeconds)
	counter(descIdleReads, s.IdleReads)
	counter(descLeaseSkipped, s.LeaseSkipped)
	gauge(descStalled, s.StalledSeconds)
	gauge(descInFlight, float64(s.InFlight))
	gauge(descUnconfirmed, float64(s.Unconfirmed))
	gauge(descWindow, float64(v.cfg.Relay.Window)) // a source may use all of W (relay.Budget)
	if v.budget != nil {
		gauge(descBudgetSourceSlots, float64(s.BudgetSlots))
		gauge(descBudgetSourceBytes, float64(s.BudgetBytes))
	} else {
		gauge(descBudgetSourceSlots, float64(s.InFlight))
		gauge(descBudgetSourceBytes, float64(s.ReadAheadBytes))
	}

	if src.table != nil {
		counter(descTableLateRows, src.table.store.LateRows()+src.table.intake.LateRows())
	}

	ls := src.leaser.Stats()
	counter(descClaims, ls.Claims)
	counter(descRenewFailures, ls.RenewalFailures)
	counter(descLosses, ls.Losses)
	counter(descHandoffs, ls.Handoffs)
	counter(descHandoffTimeouts, ls.HandoffTimeouts)
	counter(descRebalances, ls.Rebalances)
}

// collectBacklog exports the backlog snapshot of src: every partition,
// owned or not, because an unowned partition is the one that stalls.
func (c collector) collectBacklog(src *source, gauge func(*prometheus.Desc, float64, ...string), counter func(*prometheus.Desc, int64)) {
	v := c.v
	snap := src.backlog.Snapshot()
	bs := src.backlog.Stats()
	counter(descBacklogRefreshes, bs.Refreshes)
	counter(descBacklogFailures, bs.Failures)
	gauge(descBacklogDuration, bs.LastDuration.Seconds())
	now := time.Now()
	gauge(descDatabaseUp, b2f(v.health.Reachable(src.name)))
	gauge(descBacklogAvailable, b2f(snap.Fresh(now, v.backlogMaxAge())))
	switch {
	case !snap.Taken.IsZero():
		gauge(descBacklogAge, now.Sub(snap.Taken).Seconds())
	case !bs.Started.IsZero():
		gauge(descBacklogAge, now.Sub(bs.Started).Seconds())
	}
	if snap.Taken.IsZero() {
		return
	}
	for _, p := range snap.Partitions {
		l := strconv.Itoa(p.Partition)
		gauge(descPending, float64(p.Pending), l)
		gauge(descParked, float64(p.Parked), l)
		gauge(descOldest, p.OldestPendingSeconds, l)
		gauge(descLeaseLive, b2f(p.LeaseLive), l)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// newMetricsHandler returns /metrics: the node's collector, the publish
// counters, and Go's runtime and process collectors, in a registry of its
// own.
func newMetricsHandler(v *view, pm *publishFamilies) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{v}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(pm.collectors()...)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorLog: slog.NewLogLogger(v.logger.Handler(), slog.LevelWarn)})
}
