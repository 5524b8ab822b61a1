package drain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/wire"
)

// BrokerOptions are broker's: a backlog published with pipelined confirms.
type BrokerOptions struct {
	measure.Common
	measure.Backlog
	BrokerWindow int // unconfirmed publishes in flight
}

func DefaultBrokerOptions() BrokerOptions {
	return BrokerOptions{Backlog: measure.DefaultBacklog(), BrokerWindow: 1024}
}

func (o *BrokerOptions) AddFlags(fs *flag.FlagSet) {
	o.Backlog.AddFlags(fs)
	fs.IntVar(&o.BrokerWindow, "broker-window", o.BrokerWindow, "most unconfirmed publishes in flight")
}

func (o BrokerOptions) Validate() error {
	var errs []error
	if o.BrokerWindow < 1 || o.BrokerWindow > 65535 {
		errs = append(errs, fmt.Errorf("broker-window %d out of range 1..65535", o.BrokerWindow))
	}
	return errors.Join(append(errs, o.Backlog.Validate())...)
}

// RunBroker measures the broker's ceiling for this machine: a bare
// amqp091-go publisher with no database, one channel in confirm mode, at
// most -broker-window (1024) unconfirmed publishes in flight, mandatory and
// persistent, the same ~300-byte payload and headers the relays send, and
// the same consumer. -rows messages (default 100000) over -keys keys
// (default 10000), round-robin, each key's messages in key_seq order (a
// pipeline without nacks does not reorder, so the checker must find none).
func RunBroker(ctx context.Context, o BrokerOptions, emit func(*result.Result)) error {
	res, err := BrokerOnce(ctx, o)
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

func BrokerOnce(ctx context.Context, o BrokerOptions) (*result.Result, error) {
	keys := measure.OrDefault(o.Keys, 10000)
	// The rig's database is not used; the rig gives the exchange, the
	// consumer and the cleanups.
	r, err := measure.NewRig(ctx, o.Common, "broker", 1)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New("broker")
	res.Param("msgs", o.Rows)
	res.Param("keys", keys)
	res.Param("window", o.BrokerWindow)
	res.Param("payload_bytes", o.Payload)

	c, err := measure.StartRigConsumer(ctx, r, false)
	if err != nil {
		return nil, err
	}
	cpu0 := measure.SampleCPU()
	pub, err := publishBare(ctx, o, r.Exchange, o.Rows, keys)
	if err != nil {
		return nil, err
	}
	if err := c.WaitDistinct(ctx, len(pub.ids), o.Timeout, nil); err != nil {
		return nil, err
	}
	cpu1 := measure.SampleCPU()
	_, first, last := c.Distinct()
	res.Figure("msgs_per_sec", float64(len(pub.ids))/last.Sub(first).Seconds(), "msg/s")
	res.Figure("confirmed_per_sec", float64(len(pub.ids))/pub.lastConfirm.Sub(pub.start).Seconds(), "msg/s")
	res.Seconds("seconds", last.Sub(pub.start))
	res.Seconds("publish_seconds", pub.lastConfirm.Sub(pub.start))
	res.Figure("nacked", float64(pub.nacked), "")
	res.Figure("returned", float64(pub.returned), "")
	measure.AddCPU(res, cpu0, cpu1, "")
	res.Check = c.Report(pub.ids)
	res.Finished = time.Now()
	if pub.nacked > 0 || pub.returned > 0 {
		res.Note("%d nacked and %d returned publishes were not retried: they count as lost", pub.nacked, pub.returned)
	}
	return res, nil
}

// barePublish is what publishBare did.
type barePublish struct {
	ids         []string // message ids, in publish order
	start       time.Time
	lastConfirm time.Time
	nacked      int
	returned    int
}

// publishBare publishes n messages to exchange with pipelined confirms, at
// most o.BrokerWindow unconfirmed, and returns once every one is
// confirmed. Its connection and goroutines are gone when it returns.
func publishBare(ctx context.Context, o BrokerOptions, exchange string, n, keys int) (*barePublish, error) {
	conn, err := amqp.DialConfig(o.AMQPURL, amqp.Config{
		Heartbeat:  10 * time.Second,
		Dial:       amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{"connection_name": "ordo bench bare publisher"},
	})
	if err != nil {
		return nil, fmt.Errorf("publisher: connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("publisher: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("publisher: confirm mode: %w", err)
	}
	window := o.BrokerWindow
	// Buffers of window + slack: the library never blocks on them, and
	// the goroutines below drain them until the channel closes them.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window+16))
	returns := ch.NotifyReturn(make(chan amqp.Return, window+16))

	p := &barePublish{ids: make([]string, 0, n)}
	slots := make(chan struct{}, window) // a slot is an unconfirmed publish
	allConfirmed := make(chan struct{})
	confirmsClosed := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(confirmsClosed)
		got := 0
		for cf := range confirms {
			got++
			mu.Lock()
			if !cf.Ack {
				p.nacked++
			}
			p.lastConfirm = time.Now()
			mu.Unlock()
			<-slots
			if got == n {
				close(allConfirmed)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range returns {
			mu.Lock()
			p.returned++
			mu.Unlock()
		}
	}()
	// On every return path the channel closes, which ends both goroutines.
	defer func() {
		_ = ch.Close()
		wg.Wait()
	}()

	pad := strings.Repeat("x", max(0, o.Payload-len(`{"key":"key-00000","n":100000,"pad":""}`)))
	width := len(strconv.Itoa(keys - 1))
	p.start = time.Now()
	for i := range n {
		select {
		case slots <- struct{}{}:
		case <-confirmsClosed:
			return nil, fmt.Errorf("publisher: the channel closed after %d publishes", i)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		key := fmt.Sprintf("key-%0*d", width, i%keys)
		keySeq := int64(i/keys) + 1
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("message id: %w", err)
		}
		p.ids = append(p.ids, id.String())
		err = ch.PublishWithContext(ctx, exchange, "bench.event", true, false, amqp.Publishing{
			Headers: amqp.Table{
				wire.HeaderKeySeq:     keySeq,
				wire.HeaderPrevKeySeq: keySeq - 1,
				wire.HeaderPartition:  int32(partition.Of(key, o.Partitions)),
				wire.HeaderEpoch:      int64(0),
			},
			ContentType:   "application/json",
			DeliveryMode:  amqp.Persistent,
			CorrelationId: key,
			MessageId:     id.String(),
			Timestamp:     time.Now(),
			Type:          "ordo.bench.event.v1",
			Body:          fmt.Appendf(nil, `{"key":%q,"n":%d,"pad":%q}`, key, i, pad),
		})
		if err != nil {
			return nil, fmt.Errorf("publish %d: %w", i, err)
		}
	}
	t := time.NewTimer(o.Timeout)
	defer t.Stop()
	select {
	case <-allConfirmed:
	case <-confirmsClosed:
		return nil, fmt.Errorf("publisher: the channel closed before every confirm")
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, fmt.Errorf("publisher: not every confirm within %v", o.Timeout)
	}
	mu.Lock()
	defer mu.Unlock()
	out := *p
	return &out, nil
}
