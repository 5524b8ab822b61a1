package outbox

// sqlEnqueue inserts one row per array element, in array order (unnest of
// several arrays yields rows in order, so the BEFORE INSERT trigger hands out
// key_seq in that order).
const sqlEnqueue = `
INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, headers)
SELECT id, p, k, e, r, t, pl::jsonb, h::jsonb
FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])
    AS m(id, p, k, e, r, t, pl, h)`

// sqlHoldersBelowRelease lists the nodes holding an unexpired lease that
// have not recorded release $1 or later in ordo_numbering_nodes: below 2,
// relays that may still read or count the backlog through
// outbox_pending_by_partition; below 3, relays whose mark keeps a dead_at
// it did not write, for which outbox_dead_is_processed keeps producers
// from writing one.
const sqlHoldersBelowRelease = `
SELECT DISTINCT l.owner FROM ordo_leases AS l
WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM ordo_numbering_nodes AS n WHERE n.node = l.owner AND n.release >= $1)
ORDER BY l.owner`

// sqlOldNodes lists the nodes holding an unexpired lease that have not
// recorded that they number rows.
const sqlOldNodes = `
SELECT DISTINCT l.owner FROM ordo_leases AS l
WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM ordo_numbering_nodes AS n WHERE n.node = l.owner)
ORDER BY l.owner`
