"""Driver for the official RocketMQ 5 Python client (PyPI rocketmq-python-client 5.1.2), run by
tests/e2e/test_grpc_clients.py with the interpreter of .clients/py5 (scripts/setup-grpc-clients.sh).

Prints one JSON object per line: ``sent`` per message, ``received`` per message, then ``done``.

    produce --endpoint H:P --topic T --count N [--tag A] [--key K] [--prop k=v] [--body-bytes N]
            [--group G (FIFO message group)] [--tls]
    consume --endpoint H:P --topic T --group G --expect N [--timeout S] [--tls]
    transact --endpoint H:P --topic T --count N [--linger S]
        message i: commit (i % 3 == 0), rollback (i % 3 == 1), or left open for the server's check-back,
        which the checker answers COMMIT (``checked`` event); lingers so check-backs can arrive.
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


def produce(args: argparse.Namespace) -> int:
    from rocketmq import Message, Producer

    producer = Producer(config(args), (args.topic,), tls_enable=args.tls)
    producer.startup()
    try:
        for i in range(args.count):
            msg = Message()
            msg.topic = args.topic
            body = f"body-{i}".encode()
            if args.body_bytes:
                body = (body + b"x" * args.body_bytes)[: args.body_bytes]
            msg.body = body
            msg.tag = args.tag
            msg.keys = f"{args.key}{i}"
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
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(
        config(args), args.group, {args.topic: FilterExpression("*")}, await_duration=3, tls_enable=args.tls
    )
    consumer.startup()
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


def transact(args: argparse.Namespace) -> int:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    class Checker(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            emit("checked", message_id=message.message_id)
            return TransactionResolution.COMMIT

    producer = Producer(config(args), (args.topic,), checker=Checker())
    producer.startup()
    try:
        for i in range(args.count):
            msg = Message()
            msg.topic = args.topic
            msg.body = f"tx-{i}".encode()
            msg.tag = args.tag
            transaction = producer.begin_transaction()
            receipt = producer.send(msg, transaction)
            outcome = ("commit", "rollback", "open")[i % 3]
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("produce", "consume", "transact"))
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
    args = parser.parse_args()
    return {"produce": produce, "consume": consume, "transact": transact}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
