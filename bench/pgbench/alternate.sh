#!/usr/bin/env bash
# alternate.sh: CPU per one-row transaction of each piece of the outbox
# INSERT, in one backend (no network, no concurrency), every variant in
# turn, REPS times, medians and minimums (bench/pgbench/README.md).
#
#   flock -s /tmp/ordo-servers.lock bench/pgbench/alternate.sh REPS ROWS VARIANT...
#
# Variants: classic, bare, m11 (as migration 11 ships it), nonotify,
# noprobe, nolen, nopartcheck, noset, floor, nochecks, nokeyidx,
# nopartial, nopending, rowwake (the wake-up in the row trigger); m12
# (migration 12: its trigger, no CHECK constraints, no outbox_notify).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mig=$here/../../outbox/migrations
reps=$1 rows=$2; shift 2
db=ordo_pieces_alternate_$$
psqlq() { psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }
psqlq -d postgres -c "CREATE DATABASE $db"
trap 'psqlq -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
for f in "$mig"/00*.sql; do
	n=$(basename "$f" | cut -c1-4)
	[ "$((10#$n))" -le 11 ] && psqlq -d "$db" -f "$f"
done
psqlq -d "$db" -c "INSERT INTO ordo_settings (partitions) VALUES (64)" \
	-c "ALTER TABLE outbox ADD CONSTRAINT outbox_partition_range CHECK (partition >= 0 AND partition < 64)"
# cut FROM TO: the lines before the first that starts with FROM, and from
# the first after it that starts with TO.
cut() { awk -v a="$1" -v b="$2" 'index($0, a) == 1 { skip = 1 } skip && index($0, b) == 1 { skip = 0 } !skip'; }
fn11=$(sed -n '/^CREATE OR REPLACE FUNCTION/,$p' "$mig/0011_cheaper_key_seq.sql")
variant() { sed "s/FUNCTION outbox_assign_key_seq()/FUNCTION trig_$1()/"; }
{
	variant m11 <<<"$fn11"
	variant noprobe <<<"$fn11" | cut '    IF EXISTS (SELECT 1 FROM outbox WHERE id' '    IF key_partition IS DISTINCT'
	variant nolen <<<"$fn11" | cut '    -- The former CHECK constraints' '    UPDATE outbox_keys'
	variant nopartcheck <<<"$fn11" | cut '    IF key_partition IS DISTINCT' '    NEW.occurred_at'
	variant noset <<<"$fn11" | sed 's/ SET enable_seqscan = off AS/ AS/'
	variant rowwake <<<"$fn11" | sed 's/^    NEW.occurred_at := clock_timestamp();/    IF NOT pg_try_advisory_xact_lock_shared(1869767791, NEW.partition) THEN\n        PERFORM pg_notify('"'ordo_outbox'"', NEW.partition::text);\n    END IF;\n&/'
	sed -n '/^CREATE OR REPLACE FUNCTION outbox_assign_key_seq/,$p' "$mig/0012_lean_insert.sql" | variant m12
	cat "$here/alternate.sql"
} | psqlq -d "$db" -f - 2>&1 | grep -v NOTICE || true
calls=""
for r in $(seq "$reps"); do
	for v in "$@"; do calls+="CALL pieces_trial('$v', $r, $rows);"$'\n'; done
done
psqlq -d "$db" -c "SET synchronous_commit = off" -f - <<<"$calls" >/dev/null
psqlq -d "$db" -c "SELECT variant, count(*) AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY us) AS median_us, min(us) AS min_us,
	string_agg(us::text, ' ' ORDER BY rep) AS runs FROM pieces_result GROUP BY variant ORDER BY median_us"
