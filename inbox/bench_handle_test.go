package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ordo-relay/ordo/inbox"
)

// BenchmarkHandleInOrder: Store.Handle of messages in key order (each
// key's 1, 2, 3, 4), the hot path: decide, handler, advance, commit.
func BenchmarkHandleInOrder(b *testing.B) {
	_, pool := newDB(b)
	s, err := inbox.NewStore(inbox.DefaultConfig("bench"), pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	h := recordHandler("")
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		m := msg(fmt.Sprintf("k%d", i/4), int64(i%4+1), 0)
		if out, err := s.Handle(ctx, inbox.Fence{}, m, h); err != nil || out != inbox.Handled {
			b.Fatalf("%v %v", out, err)
		}
	}
}

// BenchmarkHandleBatch: the same messages in batches of 16 (group
// commit: a savepoint each, one commit per batch, unless BatchTime ends
// one early); ns/op is per message.
func BenchmarkHandleBatch(b *testing.B) {
	_, pool := newDB(b)
	cfg := inbox.DefaultConfig("bench")
	cfg.BatchSize = 16
	s, err := inbox.NewStore(cfg, pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	h := recordHandler("")
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i += 16 {
		ms := make([]*inbox.Message, 0, 16)
		for j := i; j < min(i+16, b.N); j++ {
			ms = append(ms, msg(fmt.Sprintf("k%d", j/4), int64(j%4+1), 0))
		}
		for len(ms) > 0 { // BatchTime may end a transaction early
			outs, _, err := inbox.HandleBatch(ctx, s, inbox.Fence{}, ms, h)
			if err != nil || len(outs) == 0 {
				b.Fatalf("%d of %d handled: %v", len(outs), len(ms), err)
			}
			ms = ms[len(outs):]
		}
	}
}
