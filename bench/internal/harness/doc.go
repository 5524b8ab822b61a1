// Package harness is the process and server rig that the bench scenarios
// and the nemesis share: a private database with the outbox installed
// (Rig), node processes of the real binary (Node), a cluster of node slots
// that gossip and whose convergence can be awaited (Cluster), TCP proxies
// in front of the servers, and condition waits. Every function returns
// errors; nothing here belongs to a test.
package harness
