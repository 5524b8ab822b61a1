package lease

// The Leaser's SQL, on the ordo_leases and ordo_lease_audit tables.
//
// Every statement that locks several ordo_leases rows locks them in
// ascending partition order, as the relay's writes do (relay/pgstore,
// sqlHeld), so that none of them can deadlock another (docs/design.md,
// "Lease row locks"): an ORDER BY partition ... FOR UPDATE CTE locks the
// rows as its sort emits them, and the UPDATE after it touches only rows
// it holds. An UPDATE ... FROM unnest(...) alone would lock them in the
// order of its join, here the order of the Go map the arrays came from.
const (
	// sqlClaim takes free, expired or own leases, bumping the epoch so any
	// earlier holder's writes are refused from now on, and records the
	// claim (and the expiry of another node's lease it replaces).
	sqlClaim = `
WITH prev AS (
    SELECT partition, owner, epoch, expires_at < clock_timestamp() AS expired
    FROM ordo_leases
    WHERE partition = ANY($3::int[])
      AND (owner IS NULL OR owner = $1 OR expires_at < clock_timestamp())
    ORDER BY partition
    FOR UPDATE
), claimed AS (
    UPDATE ordo_leases AS l
    SET owner = $1, epoch = l.epoch + 1,
        expires_at = clock_timestamp() + make_interval(secs => $2),
        claimed_at = clock_timestamp()
    FROM prev WHERE l.partition = prev.partition
    RETURNING l.partition, l.epoch
), expired AS (
    INSERT INTO ordo_lease_audit (node, partition, epoch, event, detail)
    SELECT prev.owner, prev.partition, prev.epoch, 'expire', 'taken over by ' || $1
    FROM prev WHERE prev.owner IS NOT NULL AND prev.owner <> $1 AND prev.expired
), audit AS (
    INSERT INTO ordo_lease_audit (node, partition, epoch, event)
    SELECT $1, partition, epoch, 'claim' FROM claimed
)
SELECT partition, epoch FROM claimed`

	// sqlRenew extends leases still held at the same epoch (locked in
	// partition order first), returning them, and records the others as
	// lost in the same statement, so that a renewal that ran always leaves
	// its audit (a second statement could be lost with the connection).
	sqlRenew = `
WITH held AS (
    SELECT * FROM unnest($3::int[], $4::bigint[]) AS h(partition, epoch)
), mine AS (
    SELECT l.partition FROM ordo_leases AS l JOIN held AS h ON l.partition = h.partition
    WHERE l.epoch = h.epoch AND l.owner = $1
    ORDER BY l.partition
    FOR UPDATE OF l
), renewed AS (
    UPDATE ordo_leases AS l
    SET expires_at = clock_timestamp() + make_interval(secs => $2)
    FROM mine WHERE l.partition = mine.partition
    RETURNING l.partition
), lost AS (
    INSERT INTO ordo_lease_audit (node, partition, epoch, event, detail)
    SELECT $1, h.partition, h.epoch, 'renew-failed', 'held by another node or epoch now'
    FROM held AS h
    WHERE h.partition NOT IN (SELECT partition FROM renewed)
)
SELECT partition FROM renewed`

	// sqlRelease frees leases still held at the same epoch and records it.
	// Like sqlRenew, it locks them in partition order first.
	sqlRelease = `
WITH mine AS (
    SELECT l.partition FROM ordo_leases AS l
    JOIN unnest($2::int[], $3::bigint[]) AS h(partition, epoch) ON l.partition = h.partition
    WHERE l.epoch = h.epoch AND l.owner = $1
    ORDER BY l.partition
    FOR UPDATE OF l
), released AS (
    UPDATE ordo_leases AS l
    SET owner = NULL, expires_at = '-infinity'
    FROM mine WHERE l.partition = mine.partition
    RETURNING l.partition, l.epoch
)
INSERT INTO ordo_lease_audit (node, partition, epoch, event)
SELECT $1, partition, epoch, 'release' FROM released`
)
