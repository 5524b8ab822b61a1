package orderapi

// SQL of the order API, all parameterised. Amounts travel as text and are
// cast to numeric by the database, so no float ever touches them.
const (
	sqlInsertOrder = `
INSERT INTO orders (id, customer_id, currency, total)
VALUES ($1, $2, $3, $4::numeric)
RETURNING placed_at`

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
)
