package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/tracing"
)

// tracerName is the instrumentation scope of the inbox's spans.
const tracerName = "github.com/ordo-relay/ordo/inbox"

// Attribute keys of the inbox's spans beside the messaging semantic
// conventions.
const (
	AttrKeySeq      = attribute.Key("ordo.key_seq")
	AttrPrevKeySeq  = attribute.Key("ordo.prev_key_seq")
	AttrPartition   = attribute.Key("ordo.partition")
	AttrShard       = attribute.Key("ordo.inbox.shard")
	AttrRedelivered = attribute.Key("ordo.inbox.redelivered") // the broker's flag: counted as an attempt
	AttrOutcome     = attribute.Key("ordo.inbox.outcome")     // handled, duplicate, stored, retrying, dead-lettered
	AttrFromStore   = attribute.Key("ordo.inbox.from_store")  // a handler run of a stored message (a gap filled, or a retry)
)

// startDelivery starts the CONSUMER span of delivery d on shard f.Shard,
// continuing the trace context in d's headers (the relay's PRODUCER
// span). m is d parsed, nil if it is invalid. Without a tracer it returns
// ctx and a nil span.
func (c *Consumer) startDelivery(ctx context.Context, f Fence, d *amqp.Delivery, m *Message) (context.Context, trace.Span) {
	if c.tracer == nil {
		return ctx, nil
	}
	queue := c.topo.ShardQueue(f.Shard)
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(d.Exchange),
		semconv.MessagingDestinationSubscriptionName(queue),
		semconv.MessagingConsumerGroupName(c.cfg.Name),
		semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey),
		semconv.MessagingMessageID(d.MessageId),
		semconv.MessagingMessageBodySize(len(d.Body)),
		AttrShard.Int(f.Shard),
		AttrRedelivered.Bool(d.Redelivered),
	}
	if m != nil {
		attrs = append(attrs, semconv.MessagingMessageConversationID(m.CorrelationID),
			AttrKeySeq.Int64(m.KeySeq), AttrPrevKeySeq.Int64(m.PrevKeySeq), AttrPartition.Int(m.Partition))
	}
	return c.tracer.Start(tracing.Extract(ctx, d.Headers), "process "+queue,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// endDelivery ends a delivery's span with what became of it: an outcome
// other than handled is an event too (a duplicate dropped, a gap stored,
// a retry scheduled, a message dead-lettered), and an error (an invalid
// message, a database failure) is recorded.
func endDelivery(span trace.Span, out Outcome, err error) {
	if span == nil {
		return
	}
	if out != 0 {
		span.SetAttributes(AttrOutcome.String(out.String()))
	}
	switch out {
	case Duplicate:
		span.AddEvent("duplicate: the key is already past this key_seq; dropped")
	case Stored:
		span.AddEvent("gap: stored until the key's earlier messages arrive")
	case Retrying:
		span.AddEvent("retrying: stored and retried with backoff")
	case DeadLettered:
		span.AddEvent("dead-lettered: out of attempts")
		span.SetStatus(codes.Error, "dead-lettered")
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// tracedHandler wraps h in a span per run, the child of the delivery's
// CONSUMER span (handlerSpan). Without a tracer it returns h.
func (c *Consumer) tracedHandler(h Handler) Handler {
	if c.tracer == nil {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		ctx, span := c.handlerSpan(ctx, m)
		return endHandlerSpan(span, h(ctx, tx, m))
	}
}

// tracedQueue wraps q in a span per run, as tracedHandler does a
// Handler: the span covers the queueing; the statements run with the
// batch. Without a tracer it returns q.
func (c *Consumer) tracedQueue(q QueueHandler) QueueHandler {
	if c.tracer == nil {
		return q
	}
	return func(ctx context.Context, m *Message, b *pgx.Batch) error {
		ctx, span := c.handlerSpan(ctx, m)
		return endHandlerSpan(span, q(ctx, m, b))
	}
}

// handlerSpan starts the span of a handler run for m, the child of the
// delivery's CONSUMER span in ctx. A stored message run later (a gap
// filled by the delivery of its predecessor, or a retry) belongs to
// another trace: its handler span continues the trace context of the
// message's own stored headers, linked to the span it ran under, if any.
func (c *Consumer) handlerSpan(ctx context.Context, m *Message) (context.Context, trace.Span) {
	var opts []trace.SpanStartOption
	cur := trace.SpanContextFromContext(ctx)
	own := trace.SpanContextFromContext(tracing.Extract(context.Background(), m.Headers))
	stored := !cur.IsValid() || (own.IsValid() && own.TraceID() != cur.TraceID())
	if stored {
		if cur.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: cur}))
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, own)
	}
	return c.tracer.Start(ctx, "handle "+m.Type, append(opts, trace.WithAttributes(
		semconv.MessagingMessageID(m.ID),
		semconv.MessagingMessageConversationID(m.CorrelationID),
		AttrKeySeq.Int64(m.KeySeq),
		AttrFromStore.Bool(stored),
		AttrRedelivered.Bool(m.Redelivered),
	))...)
}

// endHandlerSpan ends a handler's span with its error, and returns it.
func endHandlerSpan(span trace.Span, err error) error {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}
