#!/usr/bin/env bash
# pieces.sh: what each piece of the outbox INSERT costs, with pgbench.
#
#   flock -s /tmp/ordo-servers.lock bench/pgbench/pieces.sh REPS CLIENTS SECONDS VARIANT...
#
# Every run of a variant gets a fresh database (ordo_pieces_<variant>),
# 10,000 keys that already have one row each, then pgbench -M prepared
# with CLIENTS connections for SECONDS; variants alternate within each
# repetition. Between 2 s into the run and 1 s before its end it samples:
# transactions (rows in the table), the CPU of the run's backends
# (/proc/<pid>/stat), and the WAL of the run's database
# (pg_walinspect, by relation, commit records included, page images
# left out). One line per run: variant tps cpu_us_per_row wal_B_per_row.
# ROWS=N in the environment makes each transaction N inserts (default 1).
#
# Variants: classic (a narrow table: id, type, payload); article (the
# article's OutboxMessages in snake case, as bench produce's classic
# table); m11 (outbox migrations 1-11); m11-nonotify; bare (m11,
# triggers off, key_seq from a sequence); m12 (1-12); lean (every
# migration, then what outbox.DropKeySeqTrigger drops: the key_seq
# trigger, outbox_pending_by_partition, outbox_dead_is_processed); and
# m11 or lean with one piece removed, m11-<name> or lean-<name>, each a
# file variants/<name>.sql applied after the migrations (the trigger's
# pieces: alternate.sh). Talks to 127.0.0.1 only; drops its databases.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mig=$here/../../outbox/migrations
reps=$1 clients=$2 secs=$3; shift 3
rows=${ROWS:-1}
psqlq() { psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

setup() { # db variant
	local db=$1 v=$2 upto=11 script=insert-ordo.pgb table=outbox
	psqlq -d "$db" -f "$here/common.sql"
	case $v in
	classic) psqlq -d "$db" -f "$here/classic.sql"; table=classic_outbox script=insert-classic.pgb ;;
	article) psqlq -d "$db" -f "$here/article.sql"; table=classic_outbox script=insert-article.pgb ;;
	m12*) upto=12 ;;
	lean*) upto=9999 ;;
	esac
	if [ "$table" = outbox ]; then
		for f in "$mig"/*.sql; do
			n=$(basename "$f" | cut -c1-4)
			[ "$((10#$n))" -le "$upto" ] && psqlq -d "$db" -f "$f"
		done
		# what outbox.Migrate's install adds
		psqlq -d "$db" -c "INSERT INTO ordo_settings (partitions) VALUES (64)"
		if [ "$upto" -le 11 ]; then
			psqlq -d "$db" -c "ALTER TABLE outbox ADD CONSTRAINT outbox_partition_range CHECK (partition >= 0 AND partition < 64)"
		elif [ "$upto" -ge 19 ]; then
			psqlq -d "$db" -c "ALTER DOMAIN outbox_partition ADD CONSTRAINT outbox_partition_range CHECK (VALUE >= 0 AND VALUE < 64)"
		fi
	fi
	case $v in
	lean*) psqlq -d "$db" -c "DROP TRIGGER outbox_assign_key_seq ON outbox" -c "DROP INDEX outbox_pending_by_partition" \
		-c "ALTER TABLE outbox DROP CONSTRAINT outbox_dead_is_processed" ;;
	esac
	case $v in
	*-nonotify) psqlq -d "$db" -c "ALTER TABLE outbox DISABLE TRIGGER outbox_notify" ;;
	bare) psqlq -d "$db" -c "ALTER TABLE outbox DISABLE TRIGGER USER; CREATE SEQUENCE bare_key_seq"; script=insert-bare.pgb ;;
	classic | article | m11 | m12 | lean) ;;
	lean-*) psqlq -d "$db" -f "$here/variants/${v#lean-}.sql" ;;
	*) psqlq -d "$db" -f "$here/variants/${v#m1?-}.sql" ;;
	esac
	# prefill: one row per key
	if [ "$table" = outbox ] && [ "$v" != bare ]; then
		psqlq -d "$db" -c "INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
			SELECT uuid7(), k % 64, 'key-' || k, 'x', 'y', 'z', '{}' FROM generate_series(0, 9999) AS k ORDER BY 'key-' || k"
	elif [ "$v" = bare ]; then
		psqlq -d "$db" -c "INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, occurred_at)
			SELECT uuid7(), k % 64, 'key-' || k, nextval('bare_key_seq'), 'x', 'y', 'z', '{}', now() FROM generate_series(0, 9999) AS k"
	elif [ "$v" = article ]; then
		psqlq -d "$db" -c "INSERT INTO classic_outbox (id, type, routing_key, payload, correlation_id)
			SELECT uuid7(), 'z', 'y', '{}', 'key-' || k FROM generate_series(0, 9999) AS k"
	else
		psqlq -d "$db" -c "INSERT INTO classic_outbox (id, type, payload) SELECT uuid7(), 'z', '{}' FROM generate_series(0, 9999)"
	fi
	psqlq -d "$db" -c "CREATE EXTENSION pg_walinspect" -c "VACUUM ANALYZE" -c "CHECKPOINT"
	echo "$script $table"
}

# sample TABLE: rows, CPU ticks of the database's pgbench backends, WAL
# position, time; one query, so that the samples are close together.
sample() {
	echo "SELECT (SELECT count(*) FROM $1),
	(SELECT coalesce(sum(split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint), 0)
	 FROM (SELECT pg_read_file('/proc/' || pid || '/stat') AS s FROM pg_stat_activity
	       WHERE datname = current_database() AND application_name = 'pgbench') AS p),
	pg_current_wal_insert_lsn(), extract(epoch FROM clock_timestamp())" | tr '\n\t' '  '
}

walsql="
WITH r AS (
    SELECT xid, resource_manager, record_length, fpi_length,
           substring(block_ref FROM ' rel \d+/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/(\d+) ')::oid AS file
    FROM pg_get_wal_records_info(:'a'::pg_lsn, :'b'::pg_lsn)
), x AS (SELECT DISTINCT xid FROM r WHERE file IS NOT NULL AND xid <> 0)
SELECT coalesce(sum(record_length - fpi_length), 0) FROM r
WHERE file IS NOT NULL OR (resource_manager = 'Transaction' AND xid IN (SELECT xid FROM x))"

# txscript SCRIPT: SCRIPT as one insert per transaction, or ROWS of them
# in one (each with its own key).
txscript() {
	if [ "$rows" -eq 1 ]; then
		echo "$here/$1"
		return
	fi
	local out=/tmp/pieces.$$.$1
	{
		echo 'BEGIN;'
		for i in $(seq "$rows"); do
			sed -e "s/:k\b/:k$i/g" -e "s/^\\\\set k /\\\\set k$i /" "$here/$1"
		done
		echo 'COMMIT;'
	} >"$out"
	echo "$out"
}

tick=$(getconf CLK_TCK)
for rep in $(seq "$reps"); do
	for v in "$@"; do
		db=ordo_pieces_${v//-/_}
		psqlq -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
		read -r script table < <(setup "$db" "$v" | tail -1)
		PGAPPNAME=pgbench pgbench -h 127.0.0.1 -U postgres -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$(txscript "$script")" "$db" >/tmp/pieces.$$.out 2>&1 &
		bpid=$!
		sleep 2
		read -r n0 c0 l0 t0 < <(psqlq -d "$db" -AtF " " -c "$(sample "$table")")
		sleep $((secs - 5))
		read -r n1 c1 l1 t1 < <(psqlq -d "$db" -AtF " " -c "$(sample "$table")")
		wait $bpid
		wal=$(psqlq -d "$db" -At -v a="$l0" -v b="$l1" <<<"$walsql" 2>/dev/null || echo 0)
		awk -v v="$v" -v n=$((n1 - n0)) -v c=$((c1 - c0)) -v tk="$tick" -v w="$wal" -v t0="$t0" -v t1="$t1" -v r="$rep" -v k="$rows" \
			'BEGIN { printf "rep=%d %-22s tps=%7.0f cpu_us_per_row=%6.1f wal_B_per_row=%6.0f\n", r, v, n / k / (t1 - t0), c * 1e6 / tk / n, w / n }'
		psqlq -d postgres -c "DROP DATABASE $db"
	done
done
rm -f /tmp/pieces.$$.*
