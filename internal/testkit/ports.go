package testkit

import (
	"fmt"
	"net"
	"strconv"
	"testing"
)

// FreePort returns a port on 127.0.0.1 that is free for both TCP and UDP at
// the time of the call (gossip binds both on one port). Another process may
// take it before it is used; callers that can should listen on port 0
// instead.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := PickPort()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// PickPort is FreePort returning an error, for programs that are not tests.
func PickPort() (int, error) {
	var lastErr error
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lastErr = err
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		_ = ln.Close()
		if err != nil {
			lastErr = err
			continue
		}
		_ = pc.Close()
		return port, nil
	}
	return 0, fmt.Errorf("find a free port on 127.0.0.1: %w", lastErr)
}

// FreeAddr returns "127.0.0.1:port" for a port from FreePort.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := PickAddr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}

// PickAddr is FreeAddr returning an error, for programs that are not
// tests: "127.0.0.1:port" for a port from PickPort.
func PickAddr() (string, error) {
	port, err := PickPort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}
