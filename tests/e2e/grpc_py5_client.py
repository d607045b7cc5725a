"""Driver for the official RocketMQ 5 Python client (PyPI rocketmq-python-client 5.1.2), run by
tests/e2e/test_grpc_clients.py with the interpreter of .clients/py5 (scripts/setup-grpc-clients.sh).

Prints one JSON object per line: ``sent`` per message, ``received`` per message, then ``done``.

    produce --endpoint H:P --topic T --count N [--tag A] [--key K] [--prop k=v] [--body-bytes N]
            [--group G (FIFO message group)] [--tls]
    consume --endpoint H:P --topic T --group G --expect N [--timeout S] [--tls]
    transact --endpoint H:P --topic T --count N [--linger S]
        message i: commit (i % 3 == 0), rollback (i % 3 == 1), or left open for the server's check-back,
        which the checker answers COMMIT (``checked`` event); lingers so check-backs can arrive.
    push --endpoint H:P --topic T --group G --expect N [--timeout S] [--fail-first] [--tls]
        a PushConsumer (QueryAssignment-driven); ``received`` carries ``attempt`` and ``at_ms``; with
        --fail-first the first delivery of each message answers FAILURE (redelivered by the server).
    delay --endpoint H:P --topic T --group G --delay-ms D [--timeout S] [--tls]
        one producer and one SimpleConsumer in this process: sends one message due D ms from now, rounded
        up to a whole second (``sent`` carries ``due_ms``), then polls (1 s long polls) and emits
        ``empty`` / ``received`` with ``at_ms`` until it arrives or --timeout passes.
    invisible --endpoint H:P --topic T --group G --mode reappear|ack [--extend S] [--timeout S] [--tls]
        receives one message with a 30 s invisible duration, changes it to --extend seconds
        (``changed``), then ``reappear``: polls until it is redelivered (``received`` with ``at_ms``,
        ``attempt``) and acks it; ``ack``: acks with the new receipt handle (``acked``); both then poll
        4 s more and emit ``done`` with the number of later deliveries (``again``).
    recall --endpoint H:P --topic T --group G [--delay-ms D] [--timeout S] [--tls]
        sends two messages due D ms from now (whole seconds), recalls the first with its receipt's
        recall handle (``recalled``), then polls until --timeout, emitting ``received``; then recalls the
        delivered one (``late_recall``: ``ok`` and the returned ``message_id``, or the error text).
    transact-tls --endpoint H:P --topic T --count N [--tls]
        message i: commit (even i) or rollback (odd i); ``sent`` carries the outcome.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(args.endpoint, Credentials(), namespace="", request_timeout=5)


def simple_consumer(args: argparse.Namespace, await_duration: int):  # type: ignore[no-untyped-def]
    """A started SimpleConsumer of ``args.group`` subscribed to ``args.topic`` (every tag)."""
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(
        config(args),
        args.group,
        {args.topic: FilterExpression("*")},
        await_duration=await_duration,
        tls_enable=args.tls,
    )
    consumer.startup()
    return consumer


def started_producer(args: argparse.Namespace, **options: object):  # type: ignore[no-untyped-def]
    """A started Producer of ``args.topic`` (TLS as ``args.tls``; ``options`` such as ``checker``)."""
    from rocketmq import Producer

    producer = Producer(config(args), (args.topic,), tls_enable=args.tls, **options)
    producer.startup()
    return producer


def message(args: argparse.Namespace, body: bytes, **attributes: object):  # type: ignore[no-untyped-def]
    """A Message of ``args.topic`` with ``args.tag``, ``body`` and ``attributes`` set."""
    from rocketmq import Message

    msg = Message()
    msg.topic = args.topic
    msg.body = body
    msg.tag = args.tag
    for name, value in attributes.items():
        setattr(msg, name, value)
    return msg


def produce(args: argparse.Namespace) -> int:
    producer = started_producer(args)
    try:
        for i in range(args.count):
            body = f"body-{i}".encode()
            if args.body_bytes:
                body = (body + b"x" * args.body_bytes)[: args.body_bytes]
            msg = message(args, body, keys=f"{args.key}{i}")
            for kv in args.prop:
                k, _, v = kv.partition("=")
                msg.add_property(k, v)
            if args.group:
                msg.message_group = args.group
            receipt = producer.send(msg)
            emit(
                "sent",
                index=i,
                message_id=receipt.message_id,
                md5=hashlib.md5(body).hexdigest(),
                size=len(body),
            )
    finally:
        producer.shutdown()
    emit("done", sent=args.count)
    return 0


def consume(args: argparse.Namespace) -> int:
    consumer = simple_consumer(args, 3)
    got = 0
    deadline = time.monotonic() + args.timeout
    try:
        while got < args.expect and time.monotonic() < deadline:
            for msg in consumer.receive(16, 15) or []:
                body = bytes(msg.body)
                emit(
                    "received",
                    message_id=msg.message_id,
                    tag=msg.tag,
                    keys=list(msg.keys or []),
                    properties=dict(msg.properties or {}),
                    md5=hashlib.md5(body).hexdigest(),
                    size=len(body),
                    group=msg.message_group,
                    corrupted=bool(getattr(msg, "corrupted", False)),
                )
                consumer.ack(msg)
                got += 1
    finally:
        consumer.shutdown()
    emit("done", received=got)
    return 0 if got >= args.expect else 1


def _transactions(args: argparse.Namespace, outcomes: tuple[str, ...], checked: str) -> int:
    """Message i in a transaction ended by ``outcomes[i % len(outcomes)]`` (``open``: left unresolved);
    the checker answers ``checked`` (COMMIT or ROLLBACK); --linger seconds before shutdown."""
    from rocketmq import Message, TransactionChecker, TransactionResolution

    class Checker(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            emit("checked", message_id=message.message_id)
            return getattr(TransactionResolution, checked)  # a protobuf enum: members by name

    producer = started_producer(args, checker=Checker())
    try:
        for i in range(args.count):
            transaction = producer.begin_transaction()
            receipt = producer.send(message(args, f"tx-{i}".encode()), transaction)
            outcome = outcomes[i % len(outcomes)]
            if outcome == "commit":
                transaction.commit()
            elif outcome == "rollback":
                transaction.rollback()
            emit("sent", index=i, message_id=receipt.message_id, outcome=outcome)
        time.sleep(args.linger)
    finally:
        producer.shutdown()
    emit("done", sent=args.count)
    return 0


def transact(args: argparse.Namespace) -> int:
    return _transactions(args, ("commit", "rollback", "open"), "COMMIT")


def now_ms() -> int:
    return int(time.time() * 1000)


def due_epoch_s(delay_ms: int) -> int:
    """The whole epoch second at least ``delay_ms`` from now (the client takes whole seconds)."""
    return -(-(now_ms() + delay_ms) // 1000)


def push(args: argparse.Namespace) -> int:
    import threading

    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    lock = threading.Lock()
    seen: dict[str, int] = {}
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, message):  # type: ignore[no-untyped-def]
            with lock:
                attempts = seen[message.message_id] = seen.get(message.message_id, 0) + 1
                emit(
                    "received",
                    message_id=message.message_id,
                    attempt=attempts,
                    delivery_attempt=message.delivery_attempt,
                    body=bytes(message.body).decode("utf-8", "replace"),
                    at_ms=now_ms(),
                )
                if args.fail_first and attempts == 1:
                    return ConsumeResult.FAILURE
                if sum(1 for n in seen.values() if n >= (2 if args.fail_first else 1)) >= args.expect:
                    done.set()
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        config(args), args.group, Listener(), {args.topic: FilterExpression("*")}, tls_enable=args.tls
    )
    consumer.startup()
    emit("started", at_ms=now_ms())
    try:
        done.wait(args.timeout)
        time.sleep(1.5)  # let the last acks go out before shutdown
    finally:
        consumer.shutdown()
    ok = done.is_set()
    emit("done", received=len(seen))
    return 0 if ok else 1


def delay(args: argparse.Namespace) -> int:
    consumer = simple_consumer(args, 1)
    producer = started_producer(args)
    got = 0
    try:
        due_s = due_epoch_s(args.delay_ms)
        receipt = producer.send(message(args, b"delayed", delivery_timestamp=due_s))
        emit("sent", message_id=receipt.message_id, due_ms=due_s * 1000, at_ms=now_ms())
        deadline = time.monotonic() + args.timeout
        while not got and time.monotonic() < deadline:
            messages = consumer.receive(16, 15) or []
            if not messages:
                emit("empty", at_ms=now_ms())
            for m in messages:
                emit(
                    "received",
                    message_id=m.message_id,
                    at_ms=now_ms(),
                    delivery_timestamp=m.delivery_timestamp,
                )
                consumer.ack(m)
                got += 1
    finally:
        producer.shutdown()
        consumer.shutdown()
    emit("done", received=got)
    return 0 if got else 1


def invisible(args: argparse.Namespace) -> int:
    consumer = simple_consumer(args, 1)
    again = 0
    ok = False
    try:
        deadline = time.monotonic() + args.timeout
        first = []
        while not first and time.monotonic() < deadline:
            first = consumer.receive(1, 30) or []
        if not first:
            emit("done", again=0, ok=False)
            return 1
        (msg,) = first
        old_handle = msg.receipt_handle
        emit("received", message_id=msg.message_id, at_ms=now_ms(), attempt=msg.delivery_attempt)
        consumer.change_invisible_duration(msg, args.extend)
        emit("changed", at_ms=now_ms(), handle_changed=msg.receipt_handle != old_handle)
        if args.mode == "ack":
            consumer.ack(msg)
            emit("acked", message_id=msg.message_id, at_ms=now_ms())
            ok = True
        else:
            while not ok and time.monotonic() < deadline:
                for m in consumer.receive(1, 30) or []:
                    emit("received", message_id=m.message_id, at_ms=now_ms(), attempt=m.delivery_attempt)
                    consumer.ack(m)
                    ok = m.message_id == msg.message_id
        stop = time.monotonic() + 4
        while time.monotonic() < stop:
            for m in consumer.receive(1, 30) or []:
                emit("redelivered", message_id=m.message_id, at_ms=now_ms())
                consumer.ack(m)
                again += 1
    finally:
        consumer.shutdown()
    emit("done", again=again, ok=ok)
    return 0 if ok else 1


def recall(args: argparse.Namespace) -> int:
    consumer = simple_consumer(args, 1)
    producer = started_producer(args)
    got = 0
    try:
        due_s = due_epoch_s(args.delay_ms)
        receipts = []
        for name in ("recalled", "kept"):
            receipt = producer.send(message(args, name.encode(), delivery_timestamp=due_s))
            receipts.append(receipt)
            emit("sent", message_id=receipt.message_id, body=name, recall_handle=receipt.recall_handle)
        recalled_id = producer.recall_message(args.topic, receipts[0].recall_handle)
        emit("recalled", message_id=recalled_id, at_ms=now_ms(), due_ms=due_s * 1000)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            for m in consumer.receive(16, 15) or []:
                emit("received", message_id=m.message_id, body=bytes(m.body).decode(), at_ms=now_ms())
                consumer.ack(m)
                got += 1
        try:
            late_id = producer.recall_message(args.topic, receipts[1].recall_handle)
            emit("late_recall", ok=True, message_id=late_id)
        except Exception as exc:  # the client raises its own exception types
            emit("late_recall", ok=False, error=str(exc))
    finally:
        producer.shutdown()
        consumer.shutdown()
    emit("done", received=got)
    return 0


def transact_tls(args: argparse.Namespace) -> int:
    return _transactions(args, ("commit", "rollback"), "ROLLBACK")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "command",
        choices=("produce", "consume", "transact", "push", "delay", "invisible", "recall", "transact-tls"),
    )
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--tag", default="TagA")
    parser.add_argument("--key", default="key")
    parser.add_argument("--prop", action="append", default=[])
    parser.add_argument("--body-bytes", type=int, default=0)
    parser.add_argument("--group", default="")
    parser.add_argument("--expect", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--fail-first", action="store_true")
    parser.add_argument("--delay-ms", type=int, default=3000)
    parser.add_argument("--mode", choices=("reappear", "ack"), default="reappear")
    parser.add_argument("--extend", type=int, default=2)
    args = parser.parse_args()
    commands = {
        "produce": produce,
        "consume": consume,
        "transact": transact,
        "push": push,
        "delay": delay,
        "invisible": invisible,
        "recall": recall,
        "transact-tls": transact_tls,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
