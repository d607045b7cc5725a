"""Drive a C++-core RocketMQ 4.x client from the command line (run with the client's own venv).

Works with both PyPI ``rocketmq==0.4.4`` and ``rocketmq-python-cvs==2.1.0.3``: they share the
import name ``rocketmq`` and the ctypes API used here. Output is one JSON object per line on stdout:

``produce``  one ``{"event": "sent", ...}`` per acknowledged send (a refused one ends the run with
             ``{"event": "send.failed", ...}``), then ``{"event": "done", ...}``.
``consume``  ``{"event": "started"}`` once subscribed, one ``{"event": "received", ...}`` per message,
             then ``{"event": "done", ...}`` when ``--expect`` messages arrived or ``--timeout`` expired.
Every command takes ``--ak``/``--sk`` to sign its requests with ACL 1.0 (``set_session_credentials``).

``consume-fail``     like ``consume`` but the listener always fails (RECONSUME_LATER); ``received`` events
                     carry ``reconsume_times``; ``done`` after ``--duration`` seconds.
``consume-orderly``  like ``consume`` with the orderly listener (``PushConsumer(orderly=True)``: the core
                     locks its queues with LOCK_BATCH_MQ and consumes each queue on one thread).
``produce-orderly``  like ``produce`` through ``send_orderly(msg, --shard)``: every message to one queue.
``produce-txn``      (2.1 core only: ``CreateTransactionProducer`` / ``SendMessageTransaction`` of the C API,
                     which the Python binding does not wrap) one half message per ``--local`` state
                     (commit / rollback / unknown); check-backs are answered ``--check`` and reported as
                     ``{"event": "checked", ...}``; stays up to answer them until its stdin is closed, at
                     most ``--linger`` seconds.

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

#: C API ``CTransactionStatus``.
TRANSACTION_STATES = {"commit": 0, "rollback": 1, "unknown": 2}

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


def set_credentials(client: Any, args: argparse.Namespace) -> None:
    """Sign every request with ACL 1.0 when ``--ak``/``--sk`` are given (the core's ClientRPCHook)."""
    if args.ak:
        client.set_session_credentials(args.ak, args.sk, "ALIYUN")


def started_producer(args: argparse.Namespace) -> Producer:
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    set_credentials(producer, args)
    set_log_dir(producer)
    producer.start()
    return producer


def numbered_message(args: argparse.Namespace, index: int, props: dict[str, str]) -> Message:
    """Message ``index`` of ``args.topic``: keys KEY-i, tag, ``props`` plus ``seq``, body BODY-i."""
    msg = Message(args.topic)
    msg.set_keys(f"{args.key}-{index}")
    msg.set_tags(args.tag)
    for key, value in props.items():
        msg.set_property(key, value)
    msg.set_property("seq", str(index))
    msg.set_body(f"{args.body}-{index}")
    return msg


def sent_event(index: int, result: Any) -> dict[str, Any]:
    return {"event": "sent", "index": index, "msg_id": result.msg_id, "status": result.status.name,
            "offset": result.offset}


def produce(args: argparse.Namespace) -> int:
    props = parse_props(args.prop)
    producer = started_producer(args)
    sent = 0
    for index in range(args.start, args.start + args.count):
        try:
            result = producer.send_sync(numbered_message(args, index, props))
        except Exception as exc:  # the core's refusal (e.g. NO_PERMISSION): report it and stop
            emit({"event": "send.failed", "index": index, "error": f"{type(exc).__name__}: {exc}"})
            break
        emit(sent_event(index, result))
        sent += 1
    emit({"event": "done", "sent": sent})
    producer.shutdown()
    return 0 if sent == args.count else 1


def received_event(msg: RecvMessage, prop_keys: list[str]) -> dict[str, Any]:
    return {
        "event": "received",
        "t": time.time(),
        "topic": msg.topic,
        "tags": text(msg.tags),
        "keys": text(msg.keys),
        "body": text(msg.body),
        "properties": {k: v for k in prop_keys if (v := text(msg.get_property(k)))},
        "msg_id": msg.id,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "reconsume_times": msg.reconsume_times,
        "thread": threading.get_ident(),
    }


def start_consumer(args: argparse.Namespace, on_message: Any, *, orderly: bool = False) -> PushConsumer:
    """Subscribe ``on_message`` to ``args.topic`` / ``args.expression`` as ``args.group`` and start."""
    consumer = PushConsumer(args.group, orderly=orderly) if orderly else PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    set_credentials(consumer, args)
    set_log_dir(consumer)
    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    emit({"event": "started"})
    return consumer


def consume_expected(args: argparse.Namespace, *, orderly: bool) -> int:
    """Consume until ``--expect`` messages arrived or ``--timeout``; never shuts the consumer down."""
    prop_keys = [*args.prop_key, "seq"]
    received = 0
    count_lock = threading.Lock()
    enough = threading.Event()

    def on_message(msg: RecvMessage) -> None:
        nonlocal received
        emit(received_event(msg, prop_keys))
        with count_lock:
            received += 1
            if received >= args.expect:
                enough.set()

    _consumer = start_consumer(args, on_message, orderly=orderly)  # held until os._exit: never freed
    ok = enough.wait(args.timeout)
    time.sleep(args.linger)
    with count_lock:
        emit({"event": "done", "received": received, "expected": args.expect, "timed_out": not ok})
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def consume(args: argparse.Namespace) -> int:
    return consume_expected(args, orderly=False)


def consume_orderly(args: argparse.Namespace) -> int:
    return consume_expected(args, orderly=True)


def consume_fail(args: argparse.Namespace) -> int:
    prop_keys = [*args.prop_key, "seq"]

    def on_message(msg: RecvMessage) -> None:
        emit(received_event(msg, prop_keys))
        raise RuntimeError("failing on purpose")  # the binding answers RECONSUME_LATER

    _consumer = start_consumer(args, on_message)  # held until os._exit: never freed
    time.sleep(args.duration)
    emit({"event": "done"})
    sys.stdout.flush()
    os._exit(0)


def produce_orderly(args: argparse.Namespace) -> int:
    producer = started_producer(args)
    for index in range(args.start, args.start + args.count):
        emit(sent_event(index, producer.send_orderly(numbered_message(args, index, {}), args.shard)))
    emit({"event": "done", "sent": args.count})
    producer.shutdown()
    return 0


def produce_txn(args: argparse.Namespace) -> int:
    import ctypes

    from rocketmq.ffi import _CSendResult, dll  # the binding's own handle on librocketmq.so

    if not hasattr(dll, "CreateTransactionProducer"):
        emit({"event": "unsupported", "reason": "librocketmq.so has no CreateTransactionProducer"})
        return 3
    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    dll.CreateTransactionProducer.argtypes = [ctypes.c_char_p, callback, ctypes.c_void_p]
    dll.CreateTransactionProducer.restype = ctypes.c_void_p
    dll.SendMessageTransaction.argtypes = [ctypes.c_void_p, ctypes.c_void_p, callback, ctypes.c_void_p,
                                           ctypes.POINTER(_CSendResult)]
    dll.SendMessageTransaction.restype = ctypes.c_int
    answer = TRANSACTION_STATES[args.check]

    def on_check(_producer: int, msg_ext: int, _data: int) -> int:
        msg = RecvMessage(msg_ext)
        emit({"event": "checked", "t": time.time(), "keys": text(msg.keys), "body": text(msg.body),
              "topic": msg.topic, "answer": args.check})
        return answer

    def on_local(_producer: int, _msg: int, data: int) -> int:
        return int(data or 0)

    checker, executor = callback(on_check), callback(on_local)
    handle = dll.CreateTransactionProducer(args.group.encode(), checker, None)
    if not handle:
        emit({"event": "error", "reason": "CreateTransactionProducer returned NULL"})
        return 2
    dll.SetProducerNameServerAddress(handle, args.namesrv.encode())
    dll.SetProducerLogPath(handle, os.path.join(os.path.expanduser("~"), "logs").encode())
    if dll.StartProducer(handle) != 0:
        emit({"event": "error", "reason": "StartProducer failed"})
        return 2
    for index, state in enumerate(args.local):
        msg = numbered_message(args, index, {})
        msg.set_body(f"{args.body}-{index}-{state}")
        result = _CSendResult()
        local = TRANSACTION_STATES[state]
        rc = dll.SendMessageTransaction(handle, msg, executor, local, ctypes.byref(result))
        emit({"event": "sent", "index": index, "local": state, "rc": rc, "status": result.sendStatus,
              "msg_id": result.msgId.decode("utf-8", "replace"), "t": time.time()})
    released = threading.Event()  # the caller closes stdin once it has seen what it waits for
    threading.Thread(target=lambda: (sys.stdin.read(), released.set()), daemon=True).start()
    released.wait(args.linger)
    emit({"event": "done", "sent": len(args.local)})
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--namesrv", required=True, help="HOST:PORT of the name server")
    common.add_argument("--topic", required=True)
    common.add_argument("--ak", default="", help="ACL 1.0 access key (signs every request with --sk)")
    common.add_argument("--sk", default="", help="ACL 1.0 secret key")

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

    f = sub.add_parser("consume-fail", parents=[common], help="fail every message for --duration seconds")
    f.add_argument("--group", required=True)
    f.add_argument("--duration", type=float, default=20.0)
    f.add_argument("--expression", default="*")
    f.add_argument("--prop-key", action="append", default=[], metavar="K")
    f.set_defaults(run=consume_fail)

    o = sub.add_parser("consume-orderly", parents=[common], help="orderly push-consume until --expect arrive")
    o.add_argument("--group", required=True)
    o.add_argument("--expect", type=int, required=True)
    o.add_argument("--timeout", type=float, default=30.0)
    o.add_argument("--linger", type=float, default=0.0)
    o.add_argument("--expression", default="*")
    o.add_argument("--prop-key", action="append", default=[], metavar="K")
    o.set_defaults(run=consume_orderly)

    q = sub.add_parser("produce-orderly", parents=[common], help="send --count messages to one queue")
    q.add_argument("--group", default="PG")
    q.add_argument("--count", type=int, default=1)
    q.add_argument("--start", type=int, default=0)
    q.add_argument("--shard", type=int, default=0, help="queue selector argument (queue = shard %% queues)")
    q.add_argument("--tag", default="TagA")
    q.add_argument("--key", default="key")
    q.add_argument("--body", default="body")
    q.set_defaults(run=produce_orderly)

    t = sub.add_parser("produce-txn", parents=[common], help="transactional sends (2.1 core only)")
    t.add_argument("--group", default="PGTX")
    t.add_argument("--local", action="append", choices=sorted(TRANSACTION_STATES), required=True,
                   help="local transaction outcome of one message (repeatable)")
    t.add_argument("--check", choices=sorted(TRANSACTION_STATES), default="commit",
                   help="answer to every check-back")
    t.add_argument("--linger", type=float, default=0.0,
                   help="most seconds to stay up answering check-backs (until stdin is closed)")
    t.add_argument("--tag", default="TagA")
    t.add_argument("--key", default="key")
    t.add_argument("--body", default="body")
    t.set_defaults(run=produce_txn)

    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
