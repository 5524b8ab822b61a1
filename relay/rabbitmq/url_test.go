package rabbitmq

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for a logger and a reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDialErrorHidesPassword: an AMQP URL that does not parse is reported
// without its password (the library's parse error quotes the whole URL).
func TestDialErrorHidesPassword(t *testing.T) {
	var log lockedBuffer
	p := New(Config{
		URL:    "amqp://guest:50%off-Secret-2c9e@127.0.0.1:1/",
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(log.String(), "RabbitMQ unavailable") {
		if time.Now().After(deadline) {
			t.Fatal("no \"RabbitMQ unavailable\" line within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	out := log.String()
	if strings.Contains(out, "Secret-2c9e") || !strings.Contains(out, "does not parse") {
		t.Fatalf("want the parse failure without the password:\n%s", out)
	}
}
