package orderapi

// SQL of the order API, all parameterised. Amounts travel as text and are
// cast to numeric by the database, so no float ever touches them.
const (
	sqlInsertOrder = `
INSERT INTO orders (id, customer_id, currency, total, placed_at)
VALUES ($1, $2, $3, $4::numeric, $5)`

	// sqlInsertItems inserts one row per array element.
	sqlInsertItems = `
INSERT INTO order_items (order_id, line, book_id, quantity, unit_price)
SELECT $1, l, b, q, p::numeric
FROM unnest($2::int[], $3::uuid[], $4::int[], $5::text[]) AS i(l, b, q, p)`

	// sqlCancelOrder cancels a placed order. Concurrent cancels of one order
	// queue on its row lock; after the first commits, the others re-check the
	// WHERE clause, find the order cancelled and update nothing.
	sqlCancelOrder = `
UPDATE orders SET status = 'cancelled', cancelled_at = now()
WHERE id = $1 AND status = 'placed'
RETURNING cancelled_at`

	sqlOrderStatus = `SELECT status FROM orders WHERE id = $1`

	sqlSelectOrder = `
SELECT customer_id, currency, total::text, status, placed_at, cancelled_at
FROM orders WHERE id = $1`

	sqlSelectItems = `
SELECT book_id, quantity, unit_price::text
FROM order_items WHERE order_id = $1 ORDER BY line`

	// sqlClaimIdempotencyKey claims key $1 for order $3 with request hash
	// $2, or takes it over if it is older than $4 seconds. It returns a
	// row only if the key is now this transaction's. If another
	// transaction holds the key uncommitted, it waits for that one to end:
	// a commit leaves the key taken (no row), a rollback frees it.
	sqlClaimIdempotencyKey = `
INSERT INTO order_idempotency_keys AS k (key, request_hash, order_id)
VALUES ($1, $2, $3)
ON CONFLICT (key) DO UPDATE
    SET request_hash = EXCLUDED.request_hash, order_id = EXCLUDED.order_id, created_at = now()
    WHERE k.created_at < now() - make_interval(secs => $4)
RETURNING true`

	// sqlSelectIdempotencyKey reads a taken key and its order's answer.
	sqlSelectIdempotencyKey = `
SELECT k.request_hash, o.id, o.currency, o.total::text
FROM order_idempotency_keys k JOIN orders o ON o.id = k.order_id
WHERE k.key = $1`

	// sqlExpireIdempotencyKeys deletes at most $2 keys older than $1
	// seconds, skipping keys a request holds.
	sqlExpireIdempotencyKeys = `
DELETE FROM order_idempotency_keys WHERE key IN (
    SELECT key FROM order_idempotency_keys
    WHERE created_at < now() - make_interval(secs => $1)
    ORDER BY created_at LIMIT $2
    FOR UPDATE SKIP LOCKED)`
)
