// Command remoting drives github.com/apache/rocketmq-client-go/v2 (RocketMQ 4.x remoting protocol) for
// tests/e2e/test_go_clients.py. It prints JSON lines (package events) and ends with one "done" event.
//
//	remoting produce     --namesrv A --group G --topic T --count N [--tags A,B,C] [--key K] [--body B] [--prop k=v]... [--queue0]
//	remoting consume     --namesrv A --group G --topic T --selector EXPR --expect N [--timeout S]
//	remoting transaction --namesrv A --group G --topic T [--timeout S]
//
// Every command takes --ak AK --sk SK to sign its requests with ACL 1.0 (primitive.Credentials).
//
// produce: message i has tag tags[i % len(tags)], keys "K-i" and "K", body "B-i" and every --prop;
// one "sent" event per message. --queue0 sends every message to the lowest queue id of the route.
// consume: a push consumer (clustering, from the first offset) with a TAG selector; one "received"
// event per delivered message; done once N were delivered (ok=false when --timeout passes first).
// transaction: a transaction producer (lowest queue id) sends "tx-commit", "tx-rollback" and
// "tx-unknown" (local transaction: commit, rollback, unknown), answers the broker's check-back of
// tx-unknown with commit ("checked" events), then a push consumer of the topic reads until tx-unknown
// arrives ("received" events): every committed message, and nothing else, is delivered before it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"mqtest/events"
)

type props map[string]string

func (p props) String() string { return fmt.Sprint(map[string]string(p)) }

func (p props) Set(kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		return errors.New("want key=value")
	}
	p[k] = v
	return nil
}

type options struct {
	namesrv, group, topic, tags, key, body, selector string
	ak, sk                                           string
	count, expect, immunity                          int
	timeout                                          time.Duration
	queue0                                           bool
	props                                            props
}

func main() {
	// The client logs through logrus to stderr; keep warnings and errors only (pytest keeps stderr).
	rlog.SetLogLevel("warn")
	if len(os.Args) < 2 {
		events.Done(false, "reason", "usage: remoting produce|consume|transaction [flags]")
	}
	o := options{props: props{}}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	fs.StringVar(&o.namesrv, "namesrv", "", "name server host:port")
	fs.StringVar(&o.group, "group", "", "producer or consumer group")
	fs.StringVar(&o.topic, "topic", "", "topic")
	fs.StringVar(&o.tags, "tags", "TagA", "comma-separated tags, cycled over the messages")
	fs.StringVar(&o.key, "key", "key", "message key prefix")
	fs.StringVar(&o.body, "body", "body", "message body prefix")
	fs.StringVar(&o.selector, "selector", "*", "TAG subscription expression")
	fs.IntVar(&o.count, "count", 1, "messages to send")
	fs.IntVar(&o.expect, "expect", 1, "messages to receive")
	fs.IntVar(&o.immunity, "immunity", 0, "transaction: CHECK_IMMUNITY_TIME_IN_SECONDS of every message (0: none)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up after this long")
	fs.BoolVar(&o.queue0, "queue0", false, "send to the lowest queue id")
	fs.Var(o.props, "prop", "user property key=value (repeatable)")
	fs.StringVar(&o.ak, "ak", "", "ACL access key (signs every request with --sk)")
	fs.StringVar(&o.sk, "sk", "", "ACL secret key")
	_ = fs.Parse(os.Args[2:])
	switch os.Args[1] {
	case "produce":
		produce(o)
	case "consume":
		consume(o)
	case "transaction":
		transaction(o)
	default:
		events.Done(false, "reason", "unknown command "+os.Args[1])
	}
}

// lowestQueue sends every message to the queue with the lowest id (all to one queue: per-queue order).
type lowestQueue struct{}

func (lowestQueue) Select(_ *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	best := mqs[0]
	for _, mq := range mqs[1:] {
		if mq.QueueId < best.QueueId {
			best = mq
		}
	}
	return best
}

func credentials(o options) primitive.Credentials {
	return primitive.Credentials{AccessKey: o.ak, SecretKey: o.sk}
}

func resolver(o options) primitive.NsResolver {
	return primitive.NewPassthroughResolver([]string{o.namesrv})
}

func sendStatus(s primitive.SendStatus) string {
	switch s {
	case primitive.SendOK:
		return "SEND_OK"
	case primitive.SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case primitive.SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case primitive.SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	}
	return "UNKNOWN_ERROR"
}

func sentEvent(i int, body string, r *primitive.SendResult) []any {
	return []any{"i", i, "body", body, "status", sendStatus(r.Status), "msgId", r.MsgID,
		"offsetMsgId", r.OffsetMsgID, "transactionId", r.TransactionID, "topic", r.MessageQueue.Topic,
		"broker", r.MessageQueue.BrokerName, "queue", r.MessageQueue.QueueId, "offset", r.QueueOffset,
		"region", r.RegionID, "traceOn", r.TraceOn}
}

// messageEvent is what a consumer or a check-back saw of one message.
func messageEvent(m *primitive.MessageExt) []any {
	queue := -1
	if m.Queue != nil {
		queue = m.Queue.QueueId
	}
	var keys []string
	if k := m.GetKeys(); k != "" {
		keys = strings.Split(k, primitive.PropertyKeySeparator)
	}
	return []any{"topic", m.Topic, "body", string(m.Body), "tags", m.GetTags(), "keys", keys,
		"props", m.GetProperties(), "msgId", m.MsgId, "offsetMsgId", m.OffsetMsgId,
		"transactionId", m.TransactionId, "queue", queue, "offset", m.QueueOffset,
		"reconsumeTimes", m.ReconsumeTimes, "sysFlag", m.SysFlag, "bornHost", m.BornHost,
		"storeHost", m.StoreHost, "commitLogOffset", m.CommitLogOffset}
}

func newMessage(o options, i int) *primitive.Message {
	tags := strings.Split(o.tags, ",")
	msg := primitive.NewMessage(o.topic, []byte(fmt.Sprintf("%s-%d", o.body, i)))
	msg.WithTag(tags[i%len(tags)])
	msg.WithKeys([]string{fmt.Sprintf("%s-%d", o.key, i), o.key})
	for k, v := range o.props {
		msg.WithProperty(k, v)
	}
	return msg
}

func produce(o options) {
	opts := []producer.Option{producer.WithNsResolver(resolver(o)), producer.WithGroupName(o.group),
		producer.WithInstanceName(o.group), producer.WithRetry(2)}
	if o.queue0 {
		opts = append(opts, producer.WithQueueSelector(lowestQueue{}))
	}
	if o.ak != "" {
		opts = append(opts, producer.WithCredentials(credentials(o)))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		events.Done(false, "reason", "new producer: "+err.Error())
	}
	if err := p.Start(); err != nil {
		events.Done(false, "reason", "start producer: "+err.Error())
	}
	ok := true
	for i := 0; i < o.count; i++ {
		msg := newMessage(o, i)
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		r, err := p.SendSync(ctx, msg)
		cancel()
		if err != nil {
			events.Error(fmt.Sprintf("send %d", i), err)
			ok = false
			continue
		}
		events.Emit("sent", sentEvent(i, string(msg.Body), r)...)
		ok = ok && r.Status == primitive.SendOK
	}
	_ = p.Shutdown()
	events.Done(ok)
}

// collector counts delivered messages and signals when a condition holds.
type collector struct {
	mu       sync.Mutex
	received []*primitive.MessageExt
	reached  chan struct{}
	once     sync.Once
	enough   func([]*primitive.MessageExt) bool
}

func newCollector(enough func([]*primitive.MessageExt) bool) *collector {
	return &collector{reached: make(chan struct{}), enough: enough}
}

func (c *collector) listener(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		events.Emit("received", messageEvent(m)...)
		c.received = append(c.received, m)
	}
	if c.enough(c.received) {
		c.once.Do(func() { close(c.reached) })
	}
	return consumer.ConsumeSuccess, nil
}

func startConsumer(o options, group string, c *collector) (rocketmq.PushConsumer, error) {
	opts := []consumer.Option{consumer.WithNsResolver(resolver(o)), consumer.WithGroupName(group),
		consumer.WithInstance(group), consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		// a whole pull result per call, in queue order
		consumer.WithConsumeMessageBatchMaxSize(32)}
	if o.ak != "" {
		opts = append(opts, consumer.WithCredentials(credentials(o)))
	}
	pc, err := rocketmq.NewPushConsumer(opts...)
	if err != nil {
		return nil, err
	}
	sel := consumer.MessageSelector{Type: consumer.TAG, Expression: o.selector}
	if err := pc.Subscribe(o.topic, sel, c.listener); err != nil {
		return nil, err
	}
	return pc, pc.Start()
}

func consume(o options) {
	c := newCollector(func(got []*primitive.MessageExt) bool { return len(got) >= o.expect })
	pc, err := startConsumer(o, o.group, c)
	if err != nil {
		events.Done(false, "reason", "start consumer: "+err.Error())
	}
	events.Emit("started")
	select {
	case <-c.reached:
		_ = pc.Shutdown()
		events.Done(true)
	case <-time.After(o.timeout):
		c.mu.Lock()
		n := len(c.received)
		c.mu.Unlock()
		events.Done(false, "reason", fmt.Sprintf("received %d of %d within %s", n, o.expect, o.timeout))
	}
}

// txListener decides each local transaction by the message body and reports every call.
type txListener struct {
	checkedUnknown chan struct{}
	once           sync.Once
}

func decide(body string) primitive.LocalTransactionState {
	switch body {
	case "tx-commit":
		return primitive.CommitMessageState
	case "tx-rollback":
		return primitive.RollbackMessageState
	}
	return primitive.UnkonwnState
}

func stateName(s primitive.LocalTransactionState) string {
	switch s {
	case primitive.CommitMessageState:
		return "COMMIT"
	case primitive.RollbackMessageState:
		return "ROLLBACK"
	}
	return "UNKNOWN"
}

func (l *txListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	state := decide(string(m.Body))
	events.Emit("executed", "body", string(m.Body), "transactionId", m.TransactionId, "state", stateName(state))
	return state
}

func (l *txListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	state := decide(string(m.Body))
	if state == primitive.UnkonwnState { // the check-back resolves what the local transaction left open
		state = primitive.CommitMessageState
		defer l.once.Do(func() { close(l.checkedUnknown) })
	}
	events.Emit("checked", append(messageEvent(m), "state", stateName(state))...)
	return state
}

func transaction(o options) {
	deadline := time.After(o.timeout)
	l := &txListener{checkedUnknown: make(chan struct{})}
	tp, err := rocketmq.NewTransactionProducer(l, producer.WithNsResolver(resolver(o)),
		producer.WithGroupName(o.group), producer.WithInstanceName(o.group), producer.WithRetry(2),
		producer.WithQueueSelector(lowestQueue{}))
	if err != nil {
		events.Done(false, "reason", "new transaction producer: "+err.Error())
	}
	if err := tp.Start(); err != nil {
		events.Done(false, "reason", "start transaction producer: "+err.Error())
	}
	for i, body := range []string{"tx-commit", "tx-rollback", "tx-unknown"} {
		msg := primitive.NewMessage(o.topic, []byte(body))
		msg.WithTag("TagTx")
		msg.WithKeys([]string{body + "-key"})
		msg.WithProperty("scenario", "transaction")
		if o.immunity > 0 {
			msg.WithProperty(primitive.PropertyCheckImmunityTimeInSeconds, fmt.Sprint(o.immunity))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := tp.SendMessageInTransaction(ctx, msg)
		cancel()
		if err != nil {
			events.Done(false, "reason", fmt.Sprintf("send %s: %v", body, err))
		}
		events.Emit("sent", append(sentEvent(i, body, r.SendResult), "state", stateName(r.State))...)
	}
	select {
	case <-l.checkedUnknown:
	case <-deadline:
		events.Done(false, "reason", "no check-back of tx-unknown within "+o.timeout.String())
	}
	// The check-back's END_TRANSACTION is sent after CheckLocalTransaction returns: keep the producer up
	// while a consumer reads the topic until tx-unknown (the last one committed) is delivered.
	o.selector = "*"
	c := newCollector(func(got []*primitive.MessageExt) bool {
		for _, m := range got {
			if string(m.Body) == "tx-unknown" {
				return true
			}
		}
		return false
	})
	pc, err := startConsumer(o, o.group+"_verify", c)
	if err != nil {
		events.Done(false, "reason", "start consumer: "+err.Error())
	}
	select {
	case <-c.reached:
	case <-deadline:
		events.Done(false, "reason", "tx-unknown not delivered within "+o.timeout.String())
	}
	_ = pc.Shutdown()
	_ = tp.Shutdown()
	c.mu.Lock()
	bodies := make([]string, 0, len(c.received))
	for _, m := range c.received {
		bodies = append(bodies, string(m.Body))
	}
	c.mu.Unlock()
	sort.Strings(bodies)
	events.Done(true, "delivered", bodies)
}
