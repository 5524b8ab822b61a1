// Package testkit is the shared foundation for Ordo's tests against the real
// PostgreSQL and RabbitMQ servers: a fresh database per test, unique broker
// names per test, an in-process TCP proxy to cut connections, a checker
// consumer that verifies delivery and per-key order, and helpers to run the
// project's binaries as child processes that die with the test.
//
// What programs need too lives in packages that link no testing:
// internal/childproc (building and starting the project's programs, free
// ports) and internal/ordercheck (the order checker itself); testkit wraps
// them for tests, failing the test where they return an error.
//
// Names say which form a helper is. One that takes a testing.TB, fails it
// on error and cleans up when the test ends is New…, With… or Free…
// (NewDatabase, NewDatabasePool, NewProxy, WithChannel, FreeAddr). Its
// form for programs without a testing.TB returns an error and leaves the
// cleanup to the caller, and is Create…, Start… or Use… (CreateDatabase,
// StartProxy, UseChannel).
//
// Servers come from ORDO_TEST_POSTGRES_URL and ORDO_TEST_AMQP_URL, defaulting
// to the local servers on 127.0.0.1. When a server cannot be reached, tests
// that need it are skipped, with a message saying how to enable them, unless
// the CI environment variable is set: in CI they fail instead.
package testkit
