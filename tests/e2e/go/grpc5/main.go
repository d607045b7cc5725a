// Command grpc5 drives the RocketMQ 5 gRPC Go client (github.com/apache/rocketmq-clients/golang/v5) for
// tests/e2e/test_go_clients.py. It prints JSON lines (package events) and ends with one "done" event.
//
//	grpc5 send    --endpoint E --topic T --count N [--tag X] [--key K] [--body B] [--prop k=v]... [--message-group G] [--delay D]
//	grpc5 receive --endpoint E --group G --topic T --expect N [--filter EXPR] [--change-invisible D] [--timeout S]
//
// Both take --ak/--sk: the client's session credentials (Config.Credentials), with which it signs every
// call's authorization header (lower-case hex, Credential=AK//Rocketmq); without --ak it sends none.
//
// send: message i has tag X, keys "K-i" and "K", body "B-i" and every --prop; --message-group makes it a
// FIFO message, --delay a message delivered D after it is sent; one "sent" event per message.
// receive: a SimpleConsumer (h2c) receives and acks until N distinct messages were acked; one "received"
// event per delivery and one "acked" per ack. With --change-invisible, a message's first delivery is
// not acked: its invisible duration is changed to D ("changed") and it is acked when it comes again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
	v2 "github.com/apache/rocketmq-clients/golang/v5/protocol/v2"

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
	endpoint, topic, group, tag, key, body, filter, messageGroup string
	ak, sk                                                       string
	count, expect                                                int
	delay, changeInvisible, invisible, timeout                   time.Duration
	props                                                        props
}

func main() {
	if len(os.Args) < 2 {
		events.Done(false, "reason", "usage: grpc5 send|receive [flags]")
	}
	// h2c: both targets accept plaintext gRPC (mqproxy on its one port, RocketMQ's proxy in its default
	// permissive TLS mode).
	rmq.EnableSsl = false
	o := options{props: props{}}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	fs.StringVar(&o.endpoint, "endpoint", "", "gRPC endpoint host:port")
	fs.StringVar(&o.topic, "topic", "", "topic")
	fs.StringVar(&o.group, "group", "", "consumer group")
	fs.StringVar(&o.tag, "tag", "TagA", "message tag")
	fs.StringVar(&o.key, "key", "key", "message key prefix")
	fs.StringVar(&o.body, "body", "body", "message body prefix")
	fs.StringVar(&o.filter, "filter", "*", "TAG filter expression")
	fs.StringVar(&o.messageGroup, "message-group", "", "FIFO message group")
	fs.IntVar(&o.count, "count", 1, "messages to send")
	fs.IntVar(&o.expect, "expect", 1, "distinct messages to ack")
	fs.DurationVar(&o.delay, "delay", 0, "deliver this long after sending")
	fs.DurationVar(&o.changeInvisible, "change-invisible", 0, "change a first delivery's invisible duration to this")
	fs.DurationVar(&o.invisible, "invisible", 20*time.Second, "invisible duration of received messages")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up after this long")
	fs.Var(o.props, "prop", "user property key=value (repeatable)")
	fs.StringVar(&o.ak, "ak", "", "access key (session credentials)")
	fs.StringVar(&o.sk, "sk", "", "secret key (session credentials)")
	_ = fs.Parse(os.Args[2:])
	switch os.Args[1] {
	case "send":
		send(o)
	case "receive":
		receive(o)
	default:
		events.Done(false, "reason", "unknown command "+os.Args[1])
	}
}

// config is the client configuration, with session credentials when --ak is given.
func (o options) config(group string) *rmq.Config {
	c := &rmq.Config{Endpoint: o.endpoint, ConsumerGroup: group}
	if o.ak != "" {
		c.Credentials = &credentials.SessionCredentials{AccessKey: o.ak, AccessSecret: o.sk}
	}
	return c
}

func send(o options) {
	p, err := rmq.NewProducer(o.config(""), rmq.WithTopics(o.topic))
	if err != nil {
		events.Done(false, "reason", "new producer: "+err.Error())
	}
	if err := p.Start(); err != nil {
		events.Done(false, "reason", "start producer: "+err.Error())
	}
	ok := true
	for i := 0; i < o.count; i++ {
		body := fmt.Sprintf("%s-%d", o.body, i)
		msg := &rmq.Message{Topic: o.topic, Body: []byte(body)}
		msg.SetTag(o.tag)
		msg.SetKeys(fmt.Sprintf("%s-%d", o.key, i), o.key)
		for k, v := range o.props {
			msg.AddProperty(k, v)
		}
		if o.messageGroup != "" {
			msg.SetMessageGroup(o.messageGroup)
		}
		var deliverAt any
		if o.delay > 0 {
			at := time.Now().Add(o.delay)
			msg.SetDelayTimestamp(at)
			deliverAt = at.UnixMilli()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		receipts, err := p.Send(ctx, msg)
		cancel()
		if err != nil {
			events.Emit("error", "where", fmt.Sprintf("send %d", i), "message", err.Error(), "code", rpcCode(err))
			ok = false
			continue
		}
		for _, r := range receipts {
			events.Emit("sent", "i", i, "body", body, "msgId", r.MessageID, "offset", r.Offset,
				"transactionId", r.TransactionId, "recallHandle", r.RecallHandle, "deliverAt", deliverAt)
		}
	}
	_ = p.GracefulStop()
	events.Done(ok)
}

// rpcCode is the name of the v2 status code an error carries ("" when it carries none).
func rpcCode(err error) string {
	if s, ok := rmq.AsErrRpcStatus(err); ok {
		if name, known := v2.Code_name[s.GetCode()]; known {
			return name
		}
		return fmt.Sprint(s.GetCode())
	}
	return ""
}

func received(mv *rmq.MessageView) []any {
	var tag, group any
	if t := mv.GetTag(); t != nil {
		tag = *t
	}
	if g := mv.GetMessageGroup(); g != nil {
		group = *g
	}
	var delivery any
	if ts := mv.GetDeliveryTimestamp(); ts != nil {
		delivery = ts.UnixMilli()
	}
	var born any
	if ts := mv.GetBornTimestamp(); ts != nil {
		born = ts.UnixMilli()
	}
	var bornHost any
	if h := mv.GetBornHost(); h != nil {
		bornHost = *h
	}
	return []any{"msgId", mv.GetMessageId(), "topic", mv.GetTopic(), "body", string(mv.GetBody()), "tag", tag,
		"bornHost", bornHost,
		"keys", mv.GetKeys(), "props", mv.GetProperties(), "messageGroup", group, "deliveryAttempt",
		mv.GetDeliveryAttempt(), "deliveryTimestamp", delivery, "bornTimestamp", born, "offset", mv.GetOffset()}
}

func receive(o options) {
	deadline := time.Now().Add(o.timeout)
	sc, err := rmq.NewSimpleConsumer(o.config(o.group),
		rmq.WithSimpleAwaitDuration(5*time.Second),
		rmq.WithSimpleSubscriptionExpressions(map[string]*rmq.FilterExpression{
			o.topic: rmq.NewFilterExpression(o.filter)}))
	if err != nil {
		events.Done(false, "reason", "new simple consumer: "+err.Error())
	}
	if err := sc.Start(); err != nil {
		events.Done(false, "reason", "start simple consumer: "+err.Error())
	}
	events.Emit("started")
	acked := map[string]bool{}
	for len(acked) < o.expect {
		if time.Now().After(deadline) {
			events.Done(false, "reason", fmt.Sprintf("acked %d of %d within %s", len(acked), o.expect, o.timeout))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		mvs, err := sc.Receive(ctx, 16, o.invisible)
		cancel()
		if err != nil {
			if code := rpcCode(err); code != "MESSAGE_NOT_FOUND" {
				events.Emit("error", "where", "receive", "message", err.Error(), "code", code)
				time.Sleep(200 * time.Millisecond) // back off before retrying a failed call
			}
			continue
		}
		for _, mv := range mvs {
			events.Emit("received", received(mv)...)
			if o.changeInvisible > 0 && mv.GetDeliveryAttempt() == 1 {
				err := sc.ChangeInvisibleDuration(mv, o.changeInvisible)
				events.Emit("changed", "msgId", mv.GetMessageId(), "ok", err == nil, "error", errText(err),
					"code", rpcCode(err))
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := sc.Ack(ctx, mv)
			cancel()
			events.Emit("acked", "msgId", mv.GetMessageId(), "ok", err == nil, "error", errText(err),
				"code", rpcCode(err))
			if err == nil {
				acked[mv.GetMessageId()] = true
			}
		}
	}
	_ = sc.GracefulStop()
	events.Done(true, "acked", len(acked))
}

func errText(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}
