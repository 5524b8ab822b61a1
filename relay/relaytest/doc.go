// Package relaytest holds in-memory implementations of the relay's
// contracts, for tests that drive the relay's state machine without
// servers: a Store that keeps the PostgreSQL store's rules, a lease table
// with one Ownership view per node, and a Publisher that confirms, nacks,
// returns, holds, reorders, drops and blocks on command. CheckOrder checks
// what a Publisher delivered against the per-key rule.
//
// The fakes are for unit tests; every behaviour they stand in for is also
// tested against the real PostgreSQL and RabbitMQ.
package relaytest
