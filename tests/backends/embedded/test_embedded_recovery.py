"""The embedded store recovers after restarts and crashes: torn tails, corrupt records, lost or stale
indexes, closed stores, kill -9 under load."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from mqproxy.backends.embedded.commitlog import segment_name
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.index import Index
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message, PullStatus

from .recovery_helpers import (  # type: ignore[import-not-found]
    bodies,
    fill,
    recovered_event,
    segments,
)


async def test_restart_loses_nothing(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 30)
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(30)]
            assert [m.commitlog_offset for m in (await store.pull("T", 0, 0, 100)).messages] == offsets
            assert await store.max_offset("%LMQ%room", 0) == 10
            assert (await store.get_topic("T")).write_queues == 2  # type: ignore[union-attr]
            assert await store.query_consumer_offset("G", "T", 0) == 5
            nxt = await store.send(Message("T", b"after", queue_id=0, dispatch=("%LMQ%room",)))
            assert (nxt.queue_offset, nxt.lmq_offsets) == (30, {"%LMQ%room": 10})
            assert nxt.commitlog_offset > offsets[-1]
    event = recovered_event(logs)
    assert event["log_level"] == "info"
    assert (event["truncated_bytes"], event["rebuilt_entries"]) == (0, 0)
    assert event["data_dir"] == str(tmp_path)
    assert event["records"] > 0


async def test_torn_tail_garbage_is_truncated(tmp_path: Path) -> None:
    await fill(tmp_path, 10)
    last = segments(tmp_path)[-1]
    last.write_bytes(last.read_bytes() + b"\x00\x00\x01\x00garbage-half-record")
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert len(await bodies(store)) == 10
            await store.send(Message("T", b"new", queue_id=0))
            assert (await bodies(store))[-1] == b"new"
    event = recovered_event(logs)
    assert event["truncated_bytes"] == 23
    assert event["log_level"] == "warning"


async def test_record_cut_in_half_rebuilds_the_index(tmp_path: Path) -> None:
    await fill(tmp_path, 10)
    last = segments(tmp_path)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 30)
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(9)]
            assert await store.max_offset("T", 0) == 9
            assert await store.max_offset("%LMQ%room", 0) == 3, "message 9 was also in the LMQ; it is gone"
            assert (await store.send(Message("T", b"x", queue_id=0))).queue_offset == 9
    event = recovered_event(logs)
    assert event["truncated_bytes"] > 0
    assert event["rebuilt_entries"] == 9 + 3


async def test_crc_corruption_in_the_tail(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 10)
    last = segments(tmp_path)[-1]
    base = int(last.name)
    in_last = [i for i, o in enumerate(offsets) if o >= base]
    assert len(in_last) >= 3
    victim = in_last[len(in_last) // 2]  # a record in the middle of the last segment
    data = bytearray(last.read_bytes())
    data[offsets[victim] - base + 40] ^= 0x55
    last.write_bytes(bytes(data))
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(victim)]
    event = recovered_event(logs)
    assert event["truncated_bytes"] == len(data) - (offsets[victim] - base)


async def test_index_behind_the_log_is_redispatched(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 12)
    index = Index(tmp_path / "index")
    index.reset_queues()
    index.close()
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(12)]
            lmq = await store.pull("%LMQ%room", 0, 0, 100)
            assert [m.commitlog_offset for m in lmq.messages] == offsets[::3]
            assert await store.query_consumer_offset("G", "T", 0) == 5, "offsets are not part of the rebuild"
    assert recovered_event(logs)["rebuilt_entries"] == 12 + 4


async def test_deleted_index_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    await fill(tmp_path, 12, default_queue_count=3)
    shutil.rmtree(tmp_path / "index")
    async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
        assert await bodies(store) == [f"m{i}".encode() * 20 for i in range(12)]
        topic = await store.get_topic("T")
        assert topic is not None
        assert topic.write_queues == 4, "default count (4) covers queue 0"
        assert await store.max_offset("%LMQ%room", 0) == 4
        assert await store.query_consumer_offset("G", "T", 0) is None


async def test_rewound_checkpoint_redispatch_is_idempotent(tmp_path: Path) -> None:
    offsets = await fill(tmp_path, 12)
    index = Index(tmp_path / "index")
    index.commit([], [], index.next_qid(), offsets[6], index.checkpoint()[1])
    index.close()
    with capture_logs() as logs:
        async with open_embedded_store(tmp_path, segment_bytes=8192) as store:
            assert len(await bodies(store)) == 12
            assert await store.max_offset("%LMQ%room", 0) == 4
    assert recovered_event(logs)["rebuilt_entries"] == 6 + 2


async def test_store_time_never_goes_back_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_embedded_store(tmp_path) as store:
        first = await store.send(Message("T", b"a", queue_id=0))
    monkeypatch.setattr(time, "time_ns", lambda: 1_000_000_000)  # the wall clock stepped back to 1970
    async with open_embedded_store(tmp_path) as store:
        second = await store.send(Message("T", b"b", queue_id=0))
        assert second.store_timestamp_ms == first.store_timestamp_ms
        assert await store.search_offset("T", 0, first.store_timestamp_ms) == 0


async def test_closed_store_and_second_opener(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        with pytest.raises(StoreUnavailable, match="another process"):
            async with open_embedded_store(tmp_path):
                pass
    with pytest.raises(StoreUnavailable):
        await store.send(Message("T", b"x"))
    with pytest.raises(StoreUnavailable):
        await store.pull("T", 0, 0, 1)


async def test_caller_exception_is_not_wrapped(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        async with open_embedded_store(tmp_path):
            raise KeyError("mine")


async def test_long_poll_ends_when_store_closes(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create_topic("T", 1)
        outcome: list[str] = []

        async def waiter() -> None:
            try:
                await store.wait_for_message("T", 0, 0, 30)
            except StoreUnavailable:
                outcome.append("unavailable")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()  # the waiter waits
            store._close()
    assert outcome == ["unavailable"]


_WRITER = textwrap.dedent(
    """
    import sys, trio
    from pathlib import Path
    from mqproxy.backends.embedded.embedded import open_embedded_store
    from mqproxy.model.types import Message

    async def main():
        async with open_embedded_store(Path(sys.argv[1]), flush="sync", segment_bytes=256 * 1024) as store:
            async def writer(w):
                i = 0
                while True:
                    body = f"{w}-{i}".encode() * 8
                    r = await store.send(Message("K", body, queue_id=w % 4, dispatch=(f"%LMQ%w{w}",)))
                    print(w, r.queue_id, r.queue_offset, r.commitlog_offset, body.decode(), "ok", flush=True)
                    i += 1
            async with trio.open_nursery() as n:
                for w in range(8):
                    n.start_soon(writer, w)

    trio.run(main)
    """
)


@pytest.mark.slow
def test_sigkill_mid_load_keeps_every_acked_message(tmp_path: Path) -> None:
    """Sync test: it drives a subprocess with blocking calls, then checks the store under trio.run."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(lines) < 400 and time.monotonic() < deadline:  # let it run under load, then kill mid-write
        lines.append(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    lines += proc.stdout.read().splitlines(keepends=True)
    proc.wait()
    # A line cut by the kill lacks the trailing "ok" and does not count as acknowledged.
    acked = [line.split()[:5] for line in b"".join(lines).decode().splitlines() if line.endswith(" ok")]
    assert len(acked) >= 300, f"only {len(acked)} acked"  # the first line is the store.recovered log
    trio.run(_check_acked, tmp_path, acked)


async def _check_acked(tmp_path: Path, acked: list[list[str]]) -> None:
    async with open_embedded_store(tmp_path, segment_bytes=256 * 1024) as store:
        for queue_id in range(4):
            pulled = await store.pull("K", queue_id, 0, 100_000, max_bytes=1 << 30)
            by_offset = {m.queue_offset: m for m in pulled.messages}
            assert sorted(by_offset) == list(range(len(by_offset))), "offsets are contiguous"
            for _, q, qoff, clo, body in acked:
                if int(q) == queue_id:
                    m = by_offset[int(qoff)]
                    assert (m.commitlog_offset, m.body) == (int(clo), body.encode())
        for w in range(8):
            lmq = await store.pull(f"%LMQ%w{w}", 0, 0, 100_000, max_bytes=1 << 30)
            mine = [body for ww, _, _, _, body in acked if int(ww) == w]
            assert [m.body.decode() for m in lmq.messages][: len(mine)] == mine
            assert lmq.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
    assert segment_name(0) in os.listdir(tmp_path / "commitlog")
