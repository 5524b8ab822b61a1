package rabbitmq

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestDialErrorHidesPassword: Run refuses at once, with its error, an AMQP
// URL that does not parse (no retry can fix it), and the error leaves the
// password out (the library's parse error quotes the whole URL).
func TestDialErrorHidesPassword(t *testing.T) {
	var log testkit.Buffer
	cfg := Config{
		URL:    "amqp://guest:guest@127.0.0.1:1/, amqp://guest:50%off-Secret-2c9e@127.0.0.1:1/",
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
	}
	if _, err := New(cfg); err == nil || strings.Contains(err.Error(), "Secret-2c9e") {
		t.Fatalf("New = %v, want a refusal without the password", err)
	}
	p := newPublisher(cfg.withDefaults()) // past New's check, as a URL could only be if Validate missed it
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run = %v after %v, want the parse failure at once", err, ctx.Err())
	}
	if out := err.Error() + log.String(); strings.Contains(out, "Secret-2c9e") || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("want the parse failure without the password:\n%s", out)
	}
}
