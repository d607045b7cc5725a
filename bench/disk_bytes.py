"""On-disk bytes per stored 64 B MQTT message (issue 18): commit log + index, with a breakdown.

Starts ``mqproxy serve`` (embedded store, async flush) in a temporary directory, subscribes one MQTT
client to ``bench/#`` (so every message is LMQ-dispatched as in real use), publishes ``--messages``
64-byte QoS 1 PUBLISHes to ``bench/disk`` (a window of 64 in flight), waits until the subscriber has
them all, stops the proxy cleanly and reads the store back:

* commit log: bytes per message, split into frame header, record header (fixed fields, born host,
  lengths), topic, LMQ list, properties by key, base reference (a record sharing its append's earlier
  one's fields), body (:func:`~mqproxy.backends.embedded.records.layout`); and how many records are
  SHARED;
* index: the LMDB file size and, per named database, pages in use and entries (bytes per entry);
* other files under the data directory.

Peer: the layout Apache RocketMQ documents for the same message (commit-log record header 91 B +
topic + properties + body; a 20 B consume-queue entry per queue, the LMQ's included; 20 B index-file
entry per key), printed beside the figures. Usage::

    python bench/disk_bytes.py [--messages 100000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

import lmdb
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _mqtt_load import LEVEL, ByteCountingSubscriber, connect, publish_size
from _remoting_client import start_proxy

from mqproxy.backends.embedded.commitlog import CommitLog
from mqproxy.backends.embedded.record_shared import is_shared
from mqproxy.backends.embedded.records import MessageRecord, decode_message, layout
from mqproxy.codecs import mqtt

TOPIC = "bench/disk"
PAYLOAD = 64
WINDOW = 64


async def load(port: int, total: int) -> float:
    """Publish ``total`` QoS 1 messages with one subscriber reading; return seconds taken."""
    sub_client = await connect(port, "disk-sub")
    await sub_client.subscribe("bench/#", 0)
    sub = ByteCountingSubscriber(sub_client, publish_size(TOPIC, PAYLOAD, 0))
    pub = await connect(port, "disk-pub")
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sub.run)
        acked = 0
        sent = 0
        template = bytearray(
            mqtt.encode(mqtt.Publish(TOPIC, bytes(PAYLOAD), mqtt.QoS(1), packet_id=1), LEVEL)
        )
        pid_at = len(template) - PAYLOAD - 2
        while acked < total:
            burst = []
            while sent < total and sent - acked < WINDOW:
                pid = sent % 65535 + 1
                template[pid_at], template[pid_at + 1] = pid >> 8, pid & 0xFF
                template[-8:] = sent.to_bytes(8, "big")
                burst.append(bytes(template))
                sent += 1
            if burst:
                await pub.send(b"".join(burst))
            for packet in await pub.receive_packets():
                if isinstance(packet, mqtt.PubAck):
                    acked += 1
        with trio.move_on_after(60):
            while sub.received < total:  # noqa: ASYNC110 - the subscriber only counts bytes
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    elapsed = time.monotonic() - started
    await pub.aclose()
    await sub_client.aclose()
    if sub.received < total:
        print(f"warning: subscriber got {sub.received} of {total}")
    return elapsed


def rocketmq_bytes(record: MessageRecord) -> tuple[int, int]:
    """(commit-log record, consume-queue entries) bytes Apache RocketMQ's documented layout takes for this
    message: CommitLog.calMsgLength (91 B of fixed fields and length prefixes, body, topic, properties as
    ``k\\x01v\\x02``) and a 20 B ConsumeQueue entry for its queue and each LMQ."""
    properties = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in record.properties.items())
    return 91 + len(record.body) + len(record.topic.encode()) + properties, 20 * (1 + len(record.lmqs))


def commitlog_breakdown(directory: Path) -> tuple[int, collections.Counter[str], int]:
    """(records, bytes by section, segment bytes on disk); ``peer ...`` sections hold RocketMQ's bytes."""
    log, _ = CommitLog.open(directory, 1 << 30, scan_from=1 << 62)
    sections: collections.Counter[str] = collections.Counter()
    records = 0
    try:
        for offset, size, payload in log.iter_records(log.start):
            records += 1
            peer_log, peer_cq = rocketmq_bytes(decode_message(payload, offset, log))
            sections["peer commitlog"] += peer_log
            sections["peer consumequeue"] += peer_cq
            parts = layout(payload, offset, log)
            sections["frame header"] += size - len(payload)
            sections.update(parts)
            sections["(records sharing a base's fields)"] += is_shared(payload)
    finally:
        log.close()
    on_disk = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    return records, sections, on_disk


def index_breakdown(directory: Path) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(data file bytes, [(db, pages, bytes in pages, entries)])."""
    env = lmdb.open(str(directory), max_dbs=16, readonly=True, lock=False)
    rows = []
    try:
        with env.begin() as txn:
            names = [bytes(k) for k, _ in txn.cursor()]
        stat = env.stat()
        rows.append(("(main)", stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"], 0, 0))
        for name in names:
            db = env.open_db(name, create=False)
            with env.begin() as txn:
                s = txn.stat(db)
            pages = s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
            rows.append((name.decode(), pages, pages * s["psize"], s["entries"]))
        psize = stat["psize"]
        rows[0] = (rows[0][0], rows[0][1], rows[0][1] * psize, stat["entries"])
        info = env.info()
        rows.append(
            ("(file: pages up to last_pgno)", info["last_pgno"] + 1, (info["last_pgno"] + 1) * psize, 0)
        )
    finally:
        env.close()
    return (directory / "data.mdb").stat().st_size, rows


def report(data_dir: Path, total: int) -> None:
    log_dir = next(
        p for p in data_dir.rglob("*") if p.is_dir() and any(c.name.isdigit() for c in p.iterdir())
    )
    index_dir = next(p.parent for p in data_dir.rglob("data.mdb"))
    records, sections, log_disk = commitlog_breakdown(log_dir)
    messages = max(records, 1)
    print(f"commit log: {records} records, {log_disk} B on disk, {log_disk / total:.1f} B per message")
    peer_log, peer_cq = sections.pop("peer commitlog"), sections.pop("peer consumequeue")
    shared = sections.pop("(records sharing a base's fields)", 0)
    print(f"  records sharing an earlier record's fields (SHARED): {shared} ({shared / messages:.1%})")
    for name, value in sorted(sections.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<42} {value / messages:7.1f} B/message")
    file_bytes, rows = index_breakdown(index_dir)
    print(
        f"index (LMDB {index_dir.name}/data.mdb): file {file_bytes} B, {file_bytes / total:.1f} B per message"
    )
    for name, pages, used, entries in rows:
        per_entry = f"{used / entries:6.1f} B/entry" if entries else ""
        print(
            f"  {name:<30} {pages:7d} pages {used / total:7.1f} B/message  {entries:8d} entries {per_entry}"
        )
    other = 0
    for path in data_dir.rglob("*"):
        if path.is_file() and path.parent != log_dir and path.name != "data.mdb":
            other += path.stat().st_size
            print(f"  other: {path.relative_to(data_dir)} {path.stat().st_size} B")
    used_index = sum(r[2] for r in rows[:-1])
    print(
        f"total on disk: {(log_disk + file_bytes + other) / total:.1f} B per message "
        f"(commit log {log_disk / total:.1f} + index file {file_bytes / total:.1f} "
        f"+ other {other / total:.1f}); "
        f"index pages in use {used_index / total:.1f} B per message"
    )
    print(
        f"peer, Apache RocketMQ's documented layout for the same messages (computed, not run): commit log "
        f"{peer_log / messages:.1f} + consume queues {peer_cq / messages:.1f} = "
        f"{(peer_log + peer_cq) / messages:.1f} B per message (91 B record header, 20 B per queue entry; "
        "no IndexFile entry: these messages have no keys)"
    )


async def amain(total: int, keep: Path | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="disk-bytes-"))
    data_dir = tmp / "data"
    proxy = start_proxy(data_dir, tmp / "proxy.log", flush="async")
    try:
        elapsed = await load(proxy.port, total)
        print(
            f"stored {total} x {PAYLOAD} B MQTT QoS 1 messages in {elapsed:.1f} s "
            f"({total / elapsed:,.0f} msgs/s)"
        )
    finally:
        proxy.stop()
    report(data_dir, total)
    if keep is not None:
        shutil.copytree(data_dir, keep, dirs_exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="copy the data directory here")
    args = parser.parse_args()
    trio.run(amain, args.messages, args.keep)


if __name__ == "__main__":
    main()
