"""A tiny store written in the record and index layouts from before issue 18 (kind 1 commit-log records,
24-byte consume-queue values), and what it holds.

``fixtures/v1_store.tar.gz`` was written by this module run with main's code as of commit 541656b (the last
one writing those layouts)::

    /work/main/.venv/bin/python tests/backends/embedded/v1_store.py tests/backends/embedded/fixtures

``fixtures/v2_store.tar.gz`` holds the same messages written by main's code as of commit 3999a0c (compact
kind 3 records without SHARED, ``cqd`` consume-queue rows: the layouts before issue 18's round 4), with
``v2_store.tar.gz`` as the second argument.

:data:`MESSAGES` are the messages sent, in order; the archive also holds ``expected.json``: each send's
(topic, queue id, queue offset, commit-log offset, store time ms, LMQ offsets).
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import trio

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.model.types import Message

#: What was sent (``properties`` as given; the store adds the LMQ ones to a multi-dispatched message).
MESSAGES: list[dict[str, Any]] = [
    {
        "topic": "Orders",
        "body": b"\x00first\xff",
        "queue_id": 1,
        "flag": 7,
        "properties": {"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "custom key": "v\u00fc"},
        "sys_flag": 4,
        "born_timestamp_ms": 1_700_000_000_123,
        "born_host": ("192.168.1.5", 40000),
        "reconsume_times": 3,
    },
    {
        "topic": "bench",
        "body": bytes(range(64)),
        "queue_id": 0,
        "properties": {"MQTT_TOPIC": "bench/disk", "MQTT_QOS": "1", "MQTT_CLIENT_ID": "pub-1"},
        "born_timestamp_ms": 1_700_000_000_200,
        "born_host": ("127.0.0.1", 37036),
        "dispatch": ("%LMQ%bench%disk", "%LMQ%bench%|23"),
    },
    {
        "topic": "bench",
        "body": b"second",
        "queue_id": 0,
        "properties": {
            "MQTT_TOPIC": "bench/disk",
            "MQTT_QOS": "0",
            "MQTT_CLIENT_ID": "pub-1",
            "WAIT": "true",
        },
        "born_timestamp_ms": 0,
        "born_host": ("::1", 1),
        "dispatch": ("%LMQ%bench%disk",),
    },
]


def message(fields: dict[str, Any]) -> Message:
    return Message(**{k: dict(v) if k == "properties" else v for k, v in fields.items()})


async def write(data_dir: Path) -> list[list[Any]]:
    sent = []
    async with open_embedded_store(data_dir, segment_bytes=1 << 16) as store:
        for fields in MESSAGES:
            result = await store.send(message(fields))
            sent.append(
                [
                    result.topic,
                    result.queue_id,
                    result.queue_offset,
                    result.commitlog_offset,
                    result.store_timestamp_ms,
                    dict(result.lmq_offsets),
                ]
            )
    return sent


def main(out_dir: Path, name: str = "v1_store.tar.gz") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "store"
        sent = trio.run(write, data_dir)
        out = out_dir / name
        with tarfile.open(out, "w:gz") as tar:
            for path in sorted(data_dir.rglob("*")):
                if path.is_file() and path.name != "lock.mdb":
                    tar.add(path, arcname=str(path.relative_to(data_dir)))
            data = json.dumps(sent).encode()
            info = tarfile.TarInfo("expected.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
