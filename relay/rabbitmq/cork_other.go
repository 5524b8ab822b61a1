//go:build !linux

package rabbitmq

import "net"

// setCork is a no-op where TCP_CORK does not exist: every publish is
// sent on its own.
func setCork(net.Conn, bool) bool { return false }
