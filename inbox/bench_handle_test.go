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
