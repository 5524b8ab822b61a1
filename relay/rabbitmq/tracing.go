package rabbitmq

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/relay"
)

// annotateAttempt puts the publish's HeaderAttempt on the relay's span in
// ctx, if one is recording, so a basic.return logged with its attempt can
// be matched to its span.
func annotateAttempt(ctx context.Context, attempt int64) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(relay.AttrAttempt.Int64(attempt))
	}
}
