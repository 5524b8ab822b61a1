package testkit

import (
	"bytes"
	"sync"
)

// Buffer collects output that one goroutine (a logger, a child process)
// writes while the test reads it: a bytes.Buffer safe for concurrent Write
// and String. The zero value is ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
