package relayhook

import (
	"context"
	"testing"
)

func TestPerKeyLimit(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		ctx  context.Context
		want int
	}{
		{ctx, 1},
		{WithPerKeyLimit(ctx, 0), 1},
		{WithPerKeyLimit(ctx, -3), 1},
		{WithPerKeyLimit(ctx, 2), 2},
		{WithPerKeyLimit(WithPerKeyLimit(ctx, 2), 1), 1},
	} {
		if got := PerKeyLimit(c.ctx); got != c.want {
			t.Errorf("PerKeyLimit = %d, want %d", got, c.want)
		}
	}
}
