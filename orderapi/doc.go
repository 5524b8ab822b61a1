// Package orderapi is Ordo's demo service: a small bookstore order API that
// writes its business rows and its outgoing events in one PostgreSQL
// transaction through the outbox (package outbox). It never talks to the
// broker; Ordo nodes publish what it commits.
//
// # Endpoints
//
//	POST /orders              place an order            201 {"id", "total"} + Location; 400; 422 (key reused)
//	POST /orders/{id}/cancel  cancel a placed order     200 {"id", "status", "cancelledAt"}; 404; 409
//	GET  /orders/{id}         read an order             200 {...}; 404
//	GET  /healthz             database reachable        200 {"status": "ok"}; 503
//
// A new order looks like
//
//	{"customerId": "0190f5c2-...", "currency": "EUR",
//	 "items": [{"bookId": "0190f5c3-...", "quantity": 2, "unitPrice": "12.50"}]}
//
// Field names match exactly, case included: {"CustomerID": ...} is an
// unknown field, and an unknown field is answered 400 naming it (with its
// path, e.g. items[0]: unknown field "UnitPrice").
//
// # Retries
//
// POST /orders honours an Idempotency-Key header (1 to 255 printable ASCII
// characters without spaces; a UUID is a good key). The key is stored in
// the same transaction as the order, so:
//
//   - the same key with the same order (compared after validation, so
//     whitespace, field order and "12.5" against 12.50 do not matter)
//     answers 201 with the first order's id, total and Location, plus
//     Idempotent-Replayed: true, and writes nothing: one order, one
//     OrderPlaced;
//   - the same key with a different order answers 422;
//   - a request whose key is held by a request still in flight waits for
//     it to end, then replays its order (or, if it rolled back, places its
//     own).
//
// Keys are kept for Config.IdempotencyKeyTTL (24 hours by default) from
// the order they placed; after that a key may place a new order, and
// Server.RunKeyExpiry deletes it (cmd/orderapi runs it every minute).
// Requests without the header are not deduplicated.
//
// Every error, 4xx or 5xx, is a JSON object {"error": "..."} whose message
// names the offending field, e.g. "items[1].unitPrice: has 3 decimal
// places, EUR allows 2". Input that is rejected writes nothing. Database
// failures answer 500 {"error": "internal error"}; the cause is logged, never
// sent.
//
// # Money
//
// Amounts are exact. A unit price is a JSON string or number written as a
// plain decimal (digits with an optional fraction: no sign, exponent or
// hexadecimal) with at most the currency's ISO 4217 minor-unit digits, taken
// from an embedded table (see MinorDigits). Totals are computed in integer
// minor units, stored as numeric and returned as strings with exactly the
// currency's minor-unit digits: "25.00" EUR, "1500" JPY, "1.250" KWD.
//
// # Events
//
// Placing an order enqueues bookstore.order-placed.v1 (routing key
// order.placed); cancelling one enqueues bookstore.order-cancelled.v1
// (routing key order.cancelled). Both use the order id as correlation id, so
// an order's events are published in the order they happened, and both go
// to Config.Exchange. Their traceparent and tracestate headers carry the
// request's server span (Config.TracerProvider), or, with tracing off, a
// valid W3C traceparent the client sent. Payloads:
//
//	{"orderId", "customerId", "currency", "total", "placedAt",
//	 "items": [{"bookId", "quantity", "unitPrice"}]}
//	{"orderId", "cancelledAt"}
//
// with amounts as decimal strings and times in RFC 3339 (nanoseconds, UTC).
package orderapi
