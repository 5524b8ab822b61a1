// Package ordercheck is the repository's one order checker: a History of
// deliveries judged by the rules of docs/design.md ("Ordering, precisely")
// into a Report of duplicates, redeliveries, loss, reorders and gaps.
// Tests feed it through internal/testkit's Checker; the bench, the
// nemesis and cmd/demo use it directly. It links neither testing nor a
// test kit, so a command may use it.
package ordercheck
