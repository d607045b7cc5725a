"""Embedded-store micro-benchmarks: send/pull throughput, recovery time, idle-LMQ cost.

Run: ``.venv/bin/python bench/store.py [--quick]``. Numbers are single runs on a shared machine: compare
orders of magnitude, not small gaps.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import structlog
import trio
import trio.lowlevel

from mqproxy.broker.embedded import CACHE_SIZE, open_embedded_store
from mqproxy.broker.index import Index
from mqproxy.broker.types import Message


def rss_anon_kib() -> int:
    """Anonymous resident memory (Python heap etc.), excluding LMDB's reclaimable file-backed pages."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def send_bench(root: Path, size: int, flush: str, tasks: int, total: int, in_thread: bool) -> float:
    data_dir = root / f"send-{size}-{flush}-{tasks}-{in_thread}"
    body = os.urandom(size)
    async with open_embedded_store(data_dir, flush=flush, fsync_in_thread=in_thread) as store:  # type: ignore[arg-type]
        await store.create_topic("B", 4)
        per_task = total // tasks

        async def worker(w: int) -> None:
            for _ in range(per_task):
                await store.send(Message("B", body, queue_id=w % 4, properties={"TAGS": "t"}))

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(tasks):
                nursery.start_soon(worker, w)
        elapsed = time.perf_counter() - start
        fsyncs = store.fsync_count
    shutil.rmtree(data_dir)
    rate = per_task * tasks / elapsed
    print(
        f"send {size:>5} B flush={flush:<5} tasks={tasks:>2} fsync_in_thread={in_thread!s:<5} "
        f"{rate:>9.0f} msg/s  ({elapsed * 1e6 / (per_task * tasks):6.1f} µs/msg, fsyncs={fsyncs})"
    )
    return rate


async def loop_stall_bench(root: Path, in_thread: bool, total: int) -> None:
    """Worst event-loop stall seen by a probe task while 16 tasks send with sync flush."""
    data_dir = root / f"stall-{in_thread}"
    stalls: list[float] = []
    async with open_embedded_store(data_dir, flush="sync", fsync_in_thread=in_thread) as store:
        await store.create_topic("S", 4)

        async def worker(w: int) -> None:
            for _ in range(total // 16):
                await store.send(Message("S", b"x" * 128, queue_id=w % 4))

        async def probe() -> None:
            while True:
                start = time.perf_counter()
                await trio.lowlevel.checkpoint()
                stalls.append(time.perf_counter() - start)

        async with trio.open_nursery() as outer:
            outer.start_soon(probe)
            async with trio.open_nursery() as nursery:
                for w in range(16):
                    nursery.start_soon(worker, w)
            outer.cancel_scope.cancel()
    shutil.rmtree(data_dir)
    stalls.sort()
    print(
        f"loop stall during sync sends, fsync_in_thread={in_thread!s:<5}: "
        f"p50 {stalls[len(stalls) // 2] * 1e6:.0f} µs, p99 {stalls[int(len(stalls) * 0.99)] * 1e6:.0f} µs, "
        f"max {stalls[-1] * 1e3:.1f} ms"
    )


async def pull_bench(root: Path, total: int) -> None:
    data_dir = root / "pull"
    async with open_embedded_store(data_dir) as store:
        await store.create_topic("P", 1)
        body = os.urandom(128)
        for _ in range(total):
            await store.send(Message("P", body, queue_id=0, properties={"TAGS": "a"}))
        start = time.perf_counter()
        offset = 0
        while offset < total:
            result = await store.pull("P", 0, offset, 32)
            offset = result.next_offset
        elapsed = time.perf_counter() - start
    print(f"pull 128 B, 32 per pull: {total / elapsed:,.0f} msg/s ({elapsed * 1e6 / total:.1f} µs/msg)")


async def recovery_bench(root: Path, total: int) -> None:
    data_dir = root / "recovery"
    body = os.urandom(128)
    async with open_embedded_store(data_dir) as store:
        await store.create_topic("R", 4)
        for i in range(total):
            await store.send(Message("R", body, queue_id=i % 4))
    for label in ("clean reopen", "full re-dispatch"):
        if label == "full re-dispatch":
            index = Index(data_dir / "index")
            index.reset_queues()
            index.close()
        start = time.perf_counter()
        async with open_embedded_store(data_dir) as store:
            opened = time.perf_counter() - start
            assert await store.max_offset("R", 0) == total // 4
        print(f"recovery of {total:,} records, {label}: {opened * 1000:.0f} ms")


_REOPEN_PROBE = """
import sys, trio, structlog
from pathlib import Path
from mqproxy.broker.embedded import CACHE_SIZE, open_embedded_store
sys.path.insert(0, {bench_dir!r})
from store import rss_anon_kib
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

async def main():
    before = rss_anon_kib()
    async with open_embedded_store(Path({data_dir!r})) as store:
        opened = rss_anon_kib()
        for i in range(0, {count}, {step}):
            assert await store.max_offset(f"%LMQ%q{{i}}", 0) == 1
        print(before, opened, rss_anon_kib())

trio.run(main)
"""


async def lmq_bench(root: Path, count: int) -> None:
    data_dir = root / "lmq"
    async with open_embedded_store(data_dir) as store:
        await store.create_topic("Parent", 1)
        await store.send(Message("Parent", b"warm-up", queue_id=0))
        gc.collect()
        before = rss_anon_kib()
        for i in range(count):
            await store.send(Message("Parent", b"x" * 16, queue_id=0, dispatch=(f"%LMQ%q{i}",)))
        gc.collect()
        writer_growth = rss_anon_kib() - before
    probe = _REOPEN_PROBE.format(
        bench_dir=str(Path(__file__).parent), data_dir=str(data_dir), count=count, step=max(count // 1000, 1)
    )
    done = await trio.run_process([sys.executable, "-c", probe], capture_stdout=True)
    start, opened, looked_up = map(int, done.stdout.split())
    index_bytes = du(data_dir / "index")
    log_bytes = du(data_dir / "commitlog")
    print(
        f"{count:,} LMQs with one entry each: index {index_bytes / count:.0f} B/LMQ on disk "
        f"(log {log_bytes / count:.0f} B/record); writer anon RSS +{writer_growth} KiB "
        f"({writer_growth * 1024 / count:.0f} B/LMQ, bounded by the {CACHE_SIZE}-entry caches); "
        f"fresh reopen +{opened - start} KiB, +{looked_up - start} KiB after 1000 lookups"
    )


def calibrate() -> float:
    """µs for sum(range(1000)): ~8-10 on an idle core of this machine class; scales the figures."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) * 1000


async def main(quick: bool, only: str | None) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    print(f"calibration: sum(range(1000)) = {calibrate():.1f} µs")
    scale = 0.2 if quick else 1.0
    root = Path(tempfile.mkdtemp(prefix="mqproxy-bench-", dir=os.environ.get("BENCH_DIR")))
    try:
        if only == "lmq":
            await lmq_bench(root, int(100_000 * scale))
            return
        if only == "stall":
            for in_thread in (False, True):
                await loop_stall_bench(root, in_thread, int(4000 * scale))
            return
        if only == "recovery":
            await recovery_bench(root, int(100_000 * scale))
            return
        for size in (128, 4096):
            for tasks in (1, 16):
                await send_bench(root, size, "async", tasks, int(20000 * scale), False)
            for tasks in (1, 16):
                for in_thread in (False, True):
                    await send_bench(root, size, "sync", tasks, int(4000 * scale) // 16 * 16, in_thread)
        for in_thread in (False, True):
            await loop_stall_bench(root, in_thread, int(4000 * scale))
        await pull_bench(root, int(50000 * scale))
        await recovery_bench(root, int(100_000 * scale))
        await lmq_bench(root, int(100_000 * scale))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one fifth of the default sizes")
    parser.add_argument("--only", choices=["lmq", "recovery", "stall"], help="run one part")
    args = parser.parse_args()
    trio.run(main, args.quick, args.only)
