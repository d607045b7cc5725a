"""kill -9 while retention deletes segments and moves live state under load (slow tier): after the
restart every live record is there once, and every acknowledged message at or above its queue's min
offset reads back unchanged, offsets contiguous."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.retention import RetentionPolicy
from mqproxy.model.properties import SCHEDULE_TOPIC

pytestmark = pytest.mark.slow

_STATE = 300

_WRITER = textwrap.dedent(
    f"""
    import sys, trio
    from pathlib import Path
    from mqproxy.backends.embedded.embedded import open_embedded_store
    from mqproxy.backends.embedded.retention import DiskUsage, RetentionPolicy
    from mqproxy.model.properties import SCHEDULE_TOPIC
    from mqproxy.model.types import Message

    async def main():
        policy = RetentionPolicy(file_reserved_ms=0, delete_hours=None)
        async with open_embedded_store(
            Path(sys.argv[1]), segment_bytes=16384, retention=policy, clean_interval_s=0.005,
            check_interval_s=0.005, disk_probe=lambda _: DiskUsage(1 << 40, 1 << 39),
        ) as store:
            await store.create_topic("MQTT_SESSION_STATE", 1)
            await store.create_topic(SCHEDULE_TOPIC, 2)
            for i in range({_STATE}):
                await store.send(Message("MQTT_SESSION_STATE", b"state-%d" % i, queue_id=0))
                await store.send(Message(SCHEDULE_TOPIC, b"due-%d" % i, queue_id=1))
            print("live ok", flush=True)
            async def writer(w):
                i = 0
                while True:
                    body = f"{{w}}-{{i}}".encode() * 8
                    r = await store.send(Message("K", body, queue_id=w % 4, dispatch=(f"%LMQ%w{{w}}",)))
                    print(w, r.queue_id, r.queue_offset, body.decode(), "ok", flush=True)
                    i += 1
            async with trio.open_nursery() as n:
                for w in range(4):
                    n.start_soon(writer, w)

    trio.run(main)
    """
)


def test_sigkill_during_retention_keeps_live_state_and_acked_messages(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(lines) < 6000 and time.monotonic() < deadline:
        lines.append(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    lines += proc.stdout.read().splitlines(keepends=True)
    proc.wait()
    text = b"".join(lines).decode()
    assert "live ok" in text
    acked = [line.split()[:4] for line in text.splitlines() if line.endswith(" ok") and line[0].isdigit()]
    assert len(acked) >= 3000, f"only {len(acked)} acked"
    trio.run(_check, tmp_path, acked)


async def _check(tmp_path: Path, acked: list[list[str]]) -> None:
    keep = RetentionPolicy(file_reserved_ms=10**12, delete_hours=frozenset(), clean_forcibly_ratio=1.0)
    async with open_embedded_store(tmp_path, segment_bytes=16384, retention=keep) as store:
        assert len(os.listdir(tmp_path / "commitlog")) < 200, "retention kept deleting"
        assert store._log.start > 0
        low = await store.min_offset("MQTT_SESSION_STATE", 0)
        state = await store.pull("MQTT_SESSION_STATE", 0, low, 10_000, max_bytes=1 << 30)
        assert sorted(m.body for m in state.messages) == sorted(b"state-%d" % i for i in range(_STATE))
        due = await store.pull(SCHEDULE_TOPIC, 1, await store.min_offset(SCHEDULE_TOPIC, 1), 10_000)
        assert [m.body for m in due.messages] == [b"due-%d" % i for i in range(_STATE)]
        for queue_id in range(4):
            low = await store.min_offset("K", queue_id)
            high = await store.max_offset("K", queue_id)
            pulled = await store.pull("K", queue_id, low, 100_000, max_bytes=1 << 30)
            by_offset = {m.queue_offset: m.body for m in pulled.messages}
            assert sorted(by_offset) == list(range(low, high)), "offsets contiguous from the min offset"
            mine = [(int(qoff), body) for _, q, qoff, body in acked if int(q) == queue_id]
            assert high > max(offset for offset, _ in mine)
            for offset, body in mine:
                if offset >= low:
                    assert by_offset[offset] == body.encode()
