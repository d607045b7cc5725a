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
import tempfile
import time
from pathlib import Path

import structlog
import trio

from mqproxy.broker.embedded import open_embedded_store
from mqproxy.broker.index import Index
from mqproxy.broker.types import Message


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
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


async def lmq_bench(root: Path, count: int) -> None:
    data_dir = root / "lmq"
    async with open_embedded_store(data_dir) as store:
        await store.create_topic("Parent", 1)
        for i in range(count):
            await store.send(Message("Parent", b"x" * 16, queue_id=0, dispatch=(f"%LMQ%q{i}",)))
    gc.collect()
    before = rss_kib()
    async with open_embedded_store(data_dir) as store:
        gc.collect()
        after_open = rss_kib()
        for i in range(0, count, max(count // 1000, 1)):
            assert await store.max_offset(f"%LMQ%q{i}", 0) == 1
        gc.collect()
        after_reads = rss_kib()
    index_bytes = du(data_dir / "index")
    log_bytes = du(data_dir / "commitlog")
    print(
        f"{count:,} LMQs with one entry each: index {index_bytes / count:.0f} B/LMQ on disk "
        f"(log {log_bytes / count:.0f} B/record); RSS +{(after_open - before)} KiB after open, "
        f"+{(after_reads - before)} KiB after 1000 lookups (idle LMQs hold no Python objects)"
    )


async def main(quick: bool) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    scale = 0.2 if quick else 1.0
    root = Path(tempfile.mkdtemp(prefix="mqproxy-bench-", dir=os.environ.get("BENCH_DIR")))
    try:
        for size in (128, 4096):
            for tasks in (1, 16):
                await send_bench(root, size, "async", tasks, int(20000 * scale), False)
            for tasks in (1, 16):
                for in_thread in (False, True):
                    await send_bench(root, size, "sync", tasks, int(4000 * scale) // 16 * 16, in_thread)
        await pull_bench(root, int(50000 * scale))
        await recovery_bench(root, int(100_000 * scale))
        await lmq_bench(root, int(100_000 * scale))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one fifth of the default sizes")
    trio.run(main, parser.parse_args().quick)
