// Package inbox is the consumer side of Ordo: it keeps each key's order
// across several consumer instances and handles each message once, in the
// consumer's own PostgreSQL transaction.
//
// (The full package documentation is written below; see docs/consumer.md.)
package inbox
