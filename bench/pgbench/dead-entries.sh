#!/usr/bin/env bash
# dead-entries.sh: what a pass read of one partition costs with the
# dead entries that marked rows leave in outbox_ready_by_partition until
# VACUUM, with pgbench.
#
#   flock -x -o /tmp/ordo-bench2.lock bench/pgbench/dead-entries.sh SECONDS N...
#
# For each N: a fresh database (ordo_dead_entries) with every outbox
# migration, N rows in partition 5 marked processed by one UPDATE and
# three pending rows after them; one read from the partition's first row
# (which, as the relay's first pass would, finds the marked rows' entries
# dead and flags them), then pgbench -M prepared, one connection, SECONDS
# of that read (a pass's index range scan, LIMIT 512); then VACUUM and
# the same again. One line per N: N, the read's mean latency in ms
# unvacuumed and vacuumed. Talks to 127.0.0.1 only; drops its database.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mig=$here/../../outbox/migrations
secs=$1; shift
db=ordo_dead_entries
psqlq() { PGOPTIONS="-c client_min_messages=warning" psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }
script=$(mktemp)
trap 'rm -f "$script"; psqlq -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
cat > "$script" <<'SQL'
SELECT count(*) FROM (SELECT id FROM outbox AS x
    WHERE x.partition = 5 AND x.processed_at IS NULL AND x.parked_at IS NULL AND x.held_behind IS NULL AND x.seq > 0
    ORDER BY x.seq LIMIT 512) AS s;
SQL
latency() {
	pgbench -h 127.0.0.1 -U postgres -n -c 1 -T "$secs" -M prepared -f "$script" "$db" 2>&1 |
		sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p'
}
for n in "$@"; do
	psqlq -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
	psqlq -d "$db" -f "$here/common.sql"
	for f in "$mig"/*.sql; do psqlq -d "$db" -f "$f"; done
	psqlq -d "$db" -c "INSERT INTO ordo_settings (partitions) VALUES (64)"
	psqlq -d "$db" -c "INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		SELECT uuid7(), 5, 'key-' || (g % 1000), 'x', 'y', 't', '{\"a\":1}' FROM generate_series(1, $n) AS g" \
		-c "UPDATE outbox SET processed_at = clock_timestamp()" \
		-c "INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		SELECT uuid7(), 5, 'key-' || g, 'x', 'y', 't', '{}' FROM generate_series(1, 3) AS g"
	psqlq -d "$db" -f "$script" >/dev/null
	before=$(latency)
	psqlq -d "$db" -c "VACUUM outbox"
	after=$(latency)
	echo "$n $before $after"
done
