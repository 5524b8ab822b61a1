package rabbitmq

import (
	"net"
	"syscall"
)

// setCork sets TCP_CORK on c: while it is on, the kernel holds partial
// segments (for at most 200 ms) instead of sending each write at once. It
// reports false if c is not a TCP connection or the option failed.
func setCork(c net.Conn, on bool) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	v := 0
	if on {
		v = 1
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, v)
	}); err != nil {
		return false
	}
	return serr == nil
}
