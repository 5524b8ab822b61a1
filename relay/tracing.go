package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/tracing"
)

// tracerName is the instrumentation scope of the relay's spans.
const tracerName = "github.com/ordo-relay/ordo/relay"

// Attribute keys of the relay's PRODUCER spans beside the messaging
// semantic conventions. ordo.attempt (the x-ordo-attempt of the publish)
// is set by a publisher that numbers its publishes (relay/rabbitmq).
const (
	AttrPartition    = attribute.Key("ordo.partition")
	AttrKeySeq       = attribute.Key("ordo.key_seq")
	AttrPrevKeySeq   = attribute.Key("ordo.prev_key_seq")
	AttrEpoch        = attribute.Key("ordo.epoch")
	AttrAttempt      = attribute.Key("ordo.attempt")
	AttrFailedBefore = attribute.Key("ordo.failed_attempts") // failed attempts recorded before this publish
	AttrOutboxWaitMS = attribute.Key("ordo.outbox.wait_ms")  // occurred_at to this publish, milliseconds
	AttrOutcome      = attribute.Key("ordo.outcome")         // confirmed, nacked, returned, failed, unsent, not sent
	AttrParked       = attribute.Key("ordo.parked")          // the failure parked the row
	AttrNode         = attribute.Key("ordo.node")            // the publishing node
)

// startSpan starts f's PRODUCER span, named "publish <exchange>", as a
// child of the trace context the row stored (its traceparent header) or
// as a root, and writes the span's own context into the headers f is
// published with, so the consumer continues the trace. A republish
// starts again from the stored context: its span is a sibling of the
// first, in the same trace. Without a tracer it returns ctx unchanged.
func (r *Relay) startSpan(ctx context.Context, f *flight) context.Context {
	if r.flights.tracer == nil {
		return ctx
	}
	m := &f.msg
	dest := m.Exchange
	if dest == "" {
		dest = "amq.default"
	}
	ctx, span := r.flights.tracer.Start(tracing.Extract(ctx, m.Headers), "publish "+dest, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() { // an unsampled span costs no attributes
		span.SetAttributes(
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(dest),
			semconv.MessagingRabbitMQDestinationRoutingKey(m.RoutingKey),
			semconv.MessagingMessageID(m.ID.String()),
			semconv.MessagingMessageConversationID(m.CorrelationID),
			semconv.MessagingMessageBodySize(len(m.Payload)),
			AttrPartition.Int(m.Partition),
			AttrKeySeq.Int64(m.KeySeq),
			AttrPrevKeySeq.Int64(m.PrevKeySeq),
			AttrEpoch.Int64(m.Epoch),
			AttrFailedBefore.Int(f.attempts),
			AttrOutboxWaitMS.Int64(time.Since(m.OccurredAt).Milliseconds()),
			AttrNode.String(r.cfg.Node),
		)
	}
	if m.Headers == nil {
		m.Headers = make(map[string]any, 2)
	}
	delete(m.Headers, "tracestate") // the span's own, if any, replaces it
	tracing.Inject(ctx, m.Headers)
	f.span = span
	return ctx
}

// spanNotSent ends f's span for a publish that sent nothing.
func spanNotSent(f *flight, err error) {
	if f.span == nil || !f.span.IsRecording() {
		return
	}
	f.span.SetAttributes(AttrOutcome.String("not sent"))
	f.span.RecordError(err)
	f.span.End()
}

// spanSettled records res on f's span. A confirm or an Unsent ends it; a
// failure marks it an error and leaves it open until the failure is
// recorded (spanRecorded), which says whether the row was parked.
func spanSettled(f *flight, res Result) {
	if f.span == nil || !f.span.IsRecording() {
		return // an unsampled span needs no End
	}
	f.span.SetAttributes(AttrOutcome.String(res.Outcome.String()))
	switch res.Outcome {
	case Confirmed:
		f.span.End()
	case Unsent:
		if res.Err != nil {
			f.span.AddEvent("unsent: retried without counting an attempt", trace.WithAttributes(attribute.String("error", res.Err.Error())))
		}
		f.span.End()
	default:
		if res.Err != nil {
			f.span.RecordError(res.Err)
			f.span.SetStatus(codes.Error, res.Err.Error())
		} else {
			f.span.SetStatus(codes.Error, res.Outcome.String())
		}
	}
}

// spanRecorded ends the span of a failed publish once its attempt is
// recorded: a parked row's span says so, with the attempts it took.
func spanRecorded(f *flight, parked bool, attempts, maxAttempts int) {
	if f.span == nil || !f.span.IsRecording() {
		return
	}
	f.span.SetAttributes(AttrParked.Bool(parked))
	if parked {
		f.span.AddEvent("parked", trace.WithAttributes(
			attribute.Int("ordo.attempts", attempts), attribute.Int("ordo.max_attempts", maxAttempts)))
	}
	f.span.End()
}
