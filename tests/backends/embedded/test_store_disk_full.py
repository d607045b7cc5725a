"""A full disk (or a failing write): new messages are refused with StoreFull and one event, nothing stored
is damaged, reads keep working, and writes resume by themselves once space is freed. Tested by fault
injection and, where this machine lets us mount one, on a real size-limited tmpfs."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqproxy.backends.embedded import commitlog
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.backends.embedded.retention import DiskUsage, RetentionPolicy
from mqproxy.model.errors import StoreFull, StoreUnavailable
from mqproxy.model.types import Message, PullStatus
from tests.conftest import EventSink, wait_until

_KEEP_ALL = RetentionPolicy(file_reserved_ms=10**12, delete_hours=frozenset(), clean_forcibly_ratio=1.0)


class Disk:
    """A disk probe tests steer."""

    def __init__(self) -> None:
        self.usage = DiskUsage(total=1 << 30, free=1 << 29)

    def __call__(self, _: Path) -> DiskUsage:
        return self.usage


def _open(path: Path, disk: Disk | None = None, **kwargs: object):  # type: ignore[no-untyped-def]
    opts: dict[str, object] = {"segment_bytes": 64 * 1024, "check_interval_s": 0.01, "retention": _KEEP_ALL}
    if disk is not None:
        opts["disk_probe"] = disk
    opts.update(kwargs)
    return open_embedded_store(path, **opts)  # type: ignore[arg-type]


async def _bodies(store, topic: str = "T") -> list[bytes]:  # type: ignore[no-untyped-def]
    result = await store.pull(topic, 0, await store.min_offset(topic, 0), 1000)
    return [m.body for m in result.messages]


async def test_enospc_mid_write_is_cut_back_refused_once_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_sink: EventSink
) -> None:
    disk = Disk()
    real_pwrite = os.pwrite
    calls = {"n": 0}

    def torn(fd: int, data: bytes, offset: int) -> int:  # half a frame lands, then the disk is full
        calls["n"] += 1
        if calls["n"] == 1 and len(data) > 8:
            return real_pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    async with _open(tmp_path, disk) as store:
        for i in range(3):
            await store.send(Message("T", b"kept%d" % i, queue_id=0))
        end = store._log.end
        monkeypatch.setattr(commitlog.os, "pwrite", torn)
        disk.usage = DiskUsage(total=1 << 30, free=0)
        for _ in range(3):
            with pytest.raises(StoreFull, match="disk is full") as refused:
                await store.send(Message("T", b"lost", queue_id=0))
            assert refused.value.cause == "disk_full"
        assert store._log.end == end
        size = os.fstat(store._log._fds[0]).st_size
        assert size == end, "the torn half frame was cut off"
        assert await _bodies(store) == [b"kept0", b"kept1", b"kept2"]  # reads keep working
        assert len(log_sink.named("store.write_refused")) == 1
        event = log_sink.named("store.write_refused")[0]
        assert (event["cause"], event["free_bytes"]) == ("disk_full", 0)
        monkeypatch.setattr(commitlog.os, "pwrite", real_pwrite)
        disk.usage = DiskUsage(total=1 << 30, free=1 << 29)
        await wait_until(lambda: bool(log_sink.named("store.write_resumed")))
        await store.send(Message("T", b"after", queue_id=0))
    async with _open(tmp_path) as store:
        assert await _bodies(store) == [b"kept0", b"kept1", b"kept2", b"after"]


async def test_above_the_warning_ratio_writes_are_refused_until_it_drops(
    tmp_path: Path, log_sink: EventSink
) -> None:
    disk = Disk()
    async with _open(tmp_path, disk, retention=RetentionPolicy(delete_hours=frozenset())) as store:
        await store.send(Message("T", b"one", queue_id=0))
        disk.usage = DiskUsage(total=1000, free=50)  # 95 % used
        await wait_until(lambda: bool(log_sink.named("store.write_refused")))
        with pytest.raises(StoreFull, match=r"disk is full \[CL:  0.95"):
            await store.send(Message("T", b"two", queue_id=0))
        assert (await store.pull("T", 0, 0, 10)).status is PullStatus.FOUND
        await store.commit_consumer_offset("g", "T", 0, 1)  # offsets still commit
        disk.usage = DiskUsage(total=1 << 30, free=1 << 29)
        await wait_until(lambda: bool(log_sink.named("store.write_resumed")))
        await store.send(Message("T", b"three", queue_id=0))
        assert await _bodies(store) == [b"one", b"three"]
    assert len(log_sink.named("store.write_refused")) == 1


async def test_an_io_error_is_a_write_error_and_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_sink: EventSink
) -> None:
    def eio(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    async with _open(tmp_path, Disk()) as store:
        monkeypatch.setattr(commitlog.os, "pwrite", eio)
        with pytest.raises(StoreFull, match="cannot write") as refused:
            await store.send(Message("T", b"x", queue_id=0))
        assert refused.value.cause == "write_error"
        assert isinstance(refused.value, StoreUnavailable)
        assert log_sink.named("store.write_refused")[0]["cause"] == "write_error"


# --- a real, size-limited file system ---------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at ``tmp_path / "fs"`` (skips where mounting is not allowed)."""
    where = tmp_path / "fs"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_really_full_disk(small_fs: Path, log_sink: EventSink) -> None:
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\0" * 256 * 1024)
    # no ratio refusal (1.0): the writes themselves must meet ENOSPC
    policy = RetentionPolicy(
        file_reserved_ms=10**12, delete_hours=frozenset(), clean_forcibly_ratio=1.0, warning_ratio=1.0
    )
    acked: list[bytes] = []
    async with _open(small_fs / "store", retention=policy) as store:
        body = b"m" * 2000
        for i in range(5000):
            try:
                await store.send(Message("T", body + b"%d" % i, queue_id=0))
            except StoreFull:
                break
            acked.append(body + b"%d" % i)
        else:
            pytest.fail("a 2 MiB file system took 10 MB")
        assert acked, "some messages fit"
        assert await _bodies(store) == acked[:1000]  # reads keep working
        with pytest.raises(StoreFull):
            await store.send(Message("T", b"refused", queue_id=0))
        ballast.unlink()  # space comes back
        await wait_until(lambda: bool(log_sink.named("store.write_resumed")))
        await store.send(Message("T", b"after", queue_id=0))
    assert len(log_sink.named("store.write_refused")) == 1
    async with _open(small_fs / "store", retention=policy) as store:
        assert await _bodies(store) == [*acked, b"after"][:1000]
        assert await store.max_offset("T", 0) == len(acked) + 1


async def test_an_index_without_space_refuses_like_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_sink: EventSink
) -> None:
    async with _open(tmp_path, Disk()) as store:

        def full(*_: object) -> None:
            raise StoreUnavailable("index write failed: mdb_put: No space left on device")

        monkeypatch.setattr(store._index, "put_topic", full)
        with pytest.raises(StoreFull, match="disk is full"):
            await store.send(Message("NewTopic", b"x", queue_id=0))
        assert log_sink.named("store.write_refused")[0]["cause"] == "disk_full"
