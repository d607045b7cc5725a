"""Drive a C++-core RocketMQ 4.x client from the command line (run with the client's own venv).

Works with both PyPI ``rocketmq==0.4.4`` and ``rocketmq-python-cvs==2.1.0.3``: they share the
import name ``rocketmq`` and the ctypes API used here. Output is one JSON object per line on stdout:

``produce``  one ``{"event": "sent", ...}`` per acknowledged send, then ``{"event": "done", ...}``.
``consume``  ``{"event": "started"}`` once subscribed, one ``{"event": "received", ...}`` per message,
             then ``{"event": "done", ...}`` when ``--expect`` messages arrived or ``--timeout`` expired.

The 2.1 core segfaults in ``PushConsumer.shutdown()``, so ``consume`` never calls it: it waits
``--linger`` seconds (the core persists offsets every 5 s) and leaves with ``os._exit``; the broker sees
the connection close. Exit status: 0 when the expected count was reached, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from rocketmq.client import Message, Producer, PushConsumer, RecvMessage

_STDOUT_LOCK = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    """Write one JSON line to stdout atomically (callbacks run on the client's threads)."""
    line = json.dumps(obj, sort_keys=True)
    with _STDOUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def parse_props(items: list[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--prop expects KEY=VALUE, got {item!r}")
        props[key] = value
    return props


def set_log_dir(client: Producer | PushConsumer) -> None:
    """Keep the C++ core's log files under $HOME (only the 2.1 binding exposes a setter)."""
    setter = getattr(client, "set_log_root_path", None)
    if setter is not None:
        setter(os.path.join(os.path.expanduser("~"), "logs"))


def produce(args: argparse.Namespace) -> int:
    props = parse_props(args.prop)
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    set_log_dir(producer)
    producer.start()
    sent = 0
    for index in range(args.start, args.start + args.count):
        msg = Message(args.topic)
        msg.set_keys(f"{args.key}-{index}")
        msg.set_tags(args.tag)
        for key, value in props.items():
            msg.set_property(key, value)
        msg.set_property("seq", str(index))
        msg.set_body(f"{args.body}-{index}")
        result = producer.send_sync(msg)
        emit({"event": "sent", "index": index, "msg_id": result.msg_id, "status": result.status.name,
              "offset": result.offset})
        sent += 1
    emit({"event": "done", "sent": sent})
    producer.shutdown()
    return 0


def consume(args: argparse.Namespace) -> int:
    prop_keys = [*args.prop_key, "seq"]
    received = 0
    count_lock = threading.Lock()
    enough = threading.Event()

    def on_message(msg: RecvMessage) -> None:
        nonlocal received
        emit({
            "event": "received",
            "topic": msg.topic,
            "tags": text(msg.tags),
            "keys": text(msg.keys),
            "body": text(msg.body),
            "properties": {k: v for k in prop_keys if (v := text(msg.get_property(k)))},
            "msg_id": msg.id,
            "queue_id": msg.queue_id,
            "queue_offset": msg.queue_offset,
            "reconsume_times": msg.reconsume_times,
        })
        with count_lock:
            received += 1
            if received >= args.expect:
                enough.set()

    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    set_log_dir(consumer)
    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    emit({"event": "started"})
    ok = enough.wait(args.timeout)
    time.sleep(args.linger)
    with count_lock:
        emit({"event": "done", "received": received, "expected": args.expect, "timed_out": not ok})
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--namesrv", required=True, help="HOST:PORT of the name server")
    common.add_argument("--topic", required=True)

    p = sub.add_parser("produce", parents=[common], help="send --count messages synchronously")
    p.add_argument("--group", default="PG")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--start", type=int, default=0, help="first message index")
    p.add_argument("--tag", default="TagA")
    p.add_argument("--key", default="key", help="message i gets keys KEY-i")
    p.add_argument("--body", default="body", help="message i gets body BODY-i")
    p.add_argument("--prop", action="append", default=[], metavar="K=V", help="user property (repeatable)")
    p.set_defaults(run=produce)

    c = sub.add_parser("consume", parents=[common], help="push-consume until --expect messages arrive")
    c.add_argument("--group", required=True)
    c.add_argument("--expect", type=int, required=True)
    c.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for --expect messages")
    c.add_argument("--linger", type=float, default=0.0, help="seconds to stay connected afterwards")
    c.add_argument("--expression", default="*", help="tag subscription expression")
    c.add_argument("--prop-key", action="append", default=[], metavar="K",
                   help="user property to report (the C++ API cannot list them; 'seq' is always reported)")
    c.set_defaults(run=consume)

    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
