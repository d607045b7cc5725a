"""CPU time of the embedded store's append per message (issue 18), MQTT-shaped messages.

Opens an embedded store (async flush) in a temporary directory and sends ``--messages`` 64-byte
messages shaped as the MQTT gateway stores a QoS 1 PUBLISH to ``bench/disk`` with one ``bench/#``
subscriber (topic ``bench``, MQTT properties, two LMQ dispatch targets) from ``--tasks`` concurrent tasks,
so the write coalescer batches them as under fan-in. Prints process CPU µs per message (user + sys, not
wall: the machine is shared) for the whole send path and for record encoding alone. ``--reader`` adds a
task that follows the second LMQ as an MQTT push hub does (waits, then pulls 32 at a time from its
offset), so every append also builds the hand-off entries and the CPU includes those pulls (served from
the hand-off); ``--batch N`` sends runs of N messages per ``send_batch`` (one read's PUBLISHes). Usage::

    python bench/append_cpu.py [--messages 50000] [--tasks 64] [--rounds 3] [--reader] [--batch 1]
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from mqproxy.backends.embedded import records
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.records import encode_message
from mqproxy.model.types import Message

#: Records of one append that share their fields (None on a checkout before issue 18's round 4).
SharedBases: Any = getattr(records, "SharedBases", None)

PROPERTIES = {"MQTT_TOPIC": "bench/disk", "MQTT_QOS": "1", "MQTT_CLIENT_ID": "disk-pub"}
DISPATCH = ("%LMQ%bench%disk", "%LMQ%bench%|23")


def _cpu() -> float:
    return time.process_time()


async def _follow(store: Any, total: int) -> None:
    """Pull the second LMQ from offset 0 until ``total`` messages came, waiting when it is drained."""
    offset = 0
    while offset < total:
        result = await store.pull(DISPATCH[1], 0, offset, 32)
        if result.messages:
            offset = result.next_offset
        else:
            await store.wait_for_message(DISPATCH[1], 0, offset, 5.0)


async def send_round(root: Path, total: int, tasks: int, reader: bool = False, batch: int = 1) -> float:
    """CPU µs per message of ``store.send`` (``send_batch`` of ``batch``) for ``total`` messages from
    ``tasks`` tasks, with a task following an LMQ if ``reader``."""
    data_dir = Path(tempfile.mkdtemp(dir=root))
    body = bytes(64)
    async with open_embedded_store(data_dir, flush="async") as store:
        await store.create_topic("bench", 1)
        per_task = total // tasks // batch * batch

        def message() -> Message:
            return Message(
                "bench",
                body,
                queue_id=0,
                properties=dict(PROPERTIES),
                born_host=("127.0.0.1", 40000),
                born_timestamp_ms=int(time.time() * 1000),
                dispatch=DISPATCH,
            )

        async def worker() -> None:
            for _ in range(per_task // batch):
                if batch == 1:
                    await store.send(message())
                else:
                    await store.send_batch([message() for _ in range(batch)])

        start = _cpu()
        async with trio.open_nursery() as nursery:
            if reader:
                nursery.start_soon(_follow, store, per_task * tasks)
            for _ in range(tasks):
                nursery.start_soon(worker)
        used = _cpu() - start
    shutil.rmtree(data_dir)
    return used * 1e6 / (per_task * tasks)


def encode_round(total: int, batch: int = 64) -> float:
    """CPU µs per :func:`encode_message` call (the record alone), called as the append calls it: with the
    LMQ-properties hint where the record format takes one (issue 18), else with the stored properties; in
    appends of ``batch`` records sharing their fields where the format does (issue 18, round 4)."""
    body = bytes(64)
    lmqs = [(DISPATCH[0], 12345), (DISPATCH[1], 12345)]
    parameters = inspect.signature(encode_message).parameters
    shares = "shared" in parameters
    if "lmq_properties" in parameters:
        extra: dict[str, Any] = {"properties": dict(PROPERTIES), "lmq_properties": True}
    else:
        props = dict(
            PROPERTIES, INNER_MULTI_DISPATCH=",".join(DISPATCH), INNER_MULTI_QUEUE_OFFSET="12345,12345"
        )
        extra = {"properties": props}
    start = _cpu()
    for i in range(total):
        if shares and i % batch == 0:
            extra["shared"] = SharedBases()
        encode_message(
            topic="bench",
            queue_id=0,
            queue_offset=i,
            flag=0,
            sys_flag=0,
            born_timestamp_ms=1795865770125,
            store_timestamp_ms=1795865770126,
            reconsume_times=0,
            born_host=("127.0.0.1", 40000),
            lmqs=lmqs,
            body=body,
            **extra,
        )
    return (_cpu() - start) * 1e6 / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reader", action="store_true", help="a task follows an LMQ (the hand-off)")
    parser.add_argument("--batch", type=int, default=1, help="messages per send_batch")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="append-cpu-"))
    try:
        sends = [
            trio.run(send_round, root, args.messages, args.tasks, args.reader, args.batch)
            for _ in range(args.rounds)
        ]
        encodes = [encode_round(args.messages) for _ in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    shape = f"{args.tasks} tasks, batch {args.batch}" + (", a reader" if args.reader else "")
    print(
        f"store.send, {shape}: min {min(sends):.1f} µs CPU/message (rounds: "
        + ", ".join(f"{s:.1f}" for s in sends)
        + ")"
    )
    print(
        f"encode_message alone: min {min(encodes):.2f} µs CPU/message (rounds: "
        + ", ".join(f"{s:.2f}" for s in encodes)
        + ")"
    )


if __name__ == "__main__":
    main()
