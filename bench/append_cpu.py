"""CPU time of the embedded store's append per message (issue 18), MQTT-shaped messages.

Opens an embedded store (async flush) in a temporary directory and sends ``--messages`` 64-byte
messages shaped as the MQTT gateway stores a QoS 1 PUBLISH to ``bench/disk`` with one ``bench/#``
subscriber (topic ``bench``, MQTT properties, two LMQ dispatch targets) from ``--tasks`` concurrent tasks,
so the write coalescer batches them as under fan-in. Prints process CPU µs per message (user + sys, not
wall: the machine is shared) for the whole send path and for record encoding alone. Usage::

    python bench/append_cpu.py [--messages 50000] [--tasks 64] [--rounds 3]
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


async def send_round(root: Path, total: int, tasks: int) -> float:
    """CPU µs per message of ``store.send`` for ``total`` messages from ``tasks`` tasks."""
    data_dir = Path(tempfile.mkdtemp(dir=root))
    body = bytes(64)
    async with open_embedded_store(data_dir, flush="async") as store:
        await store.create_topic("bench", 1)
        per_task = total // tasks

        async def worker() -> None:
            for _ in range(per_task):
                message = Message(
                    "bench",
                    body,
                    queue_id=0,
                    properties=dict(PROPERTIES),
                    born_host=("127.0.0.1", 40000),
                    born_timestamp_ms=int(time.time() * 1000),
                    dispatch=DISPATCH,
                )
                await store.send(message)

        start = _cpu()
        async with trio.open_nursery() as nursery:
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
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="append-cpu-"))
    try:
        sends = [trio.run(send_round, root, args.messages, args.tasks) for _ in range(args.rounds)]
        encodes = [encode_round(args.messages) for _ in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"store.send, {args.tasks} tasks: min {min(sends):.1f} µs CPU/message (rounds: "
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
