"""Embedded-store micro-benchmarks: send/pull throughput, recovery time, idle-LMQ cost and sweep.

Run: ``.venv/bin/python bench/store.py [--quick]``. Numbers are single runs on a shared machine: compare
orders of magnitude, not small gaps.
"""

from __future__ import annotations

import argparse
import gc
import math
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

from mqproxy.backends.embedded import embedded_queues
from mqproxy.backends.embedded.embedded import CACHE_SIZE, open_embedded_store
from mqproxy.backends.embedded.index import Index
from mqproxy.model.types import Message


def rss_anon_kib() -> int:
    """Anonymous resident memory (Python heap etc.), excluding LMDB's reclaimable file-backed pages."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_kib() -> int:
    """Resident memory including LMDB's file-backed (reclaimable) pages."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


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
from mqproxy.backends.embedded.embedded import CACHE_SIZE, open_embedded_store
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


async def lmq_sweep_bench(root: Path, count: int, budget_s: float) -> None:
    """Create up to ``count`` light queues (one 16-byte message each, 100 per batch) within ``budget_s``,
    then sweep: once while none is idle (the steady-state cost of a sweep), once deleting them all.

    Each sweep is one full pass (the per-call time budget is lifted; by default a call stops after
    ``SWEEP_CALL_BUDGET_S`` of event-loop time and the next call resumes)."""
    embedded_queues.SWEEP_CALL_BUDGET_S = math.inf
    data_dir = root / "lmq-sweep"
    batch = 100
    async with open_embedded_store(data_dir) as store:
        await store.create_topic("Parent", 1)
        start = time.perf_counter()
        created = 0
        while created < count and time.perf_counter() - start < budget_s:
            n = min(batch, count - created)
            await store.send_batch(
                [Message("Parent", b"x" * 16, 0, dispatch=(f"%LMQ%q{created + i}",)) for i in range(n)]
            )
            created += n
        elapsed = time.perf_counter() - start
        print(
            f"created {created:,} LMQs (one message each) in {elapsed:.1f} s "
            f"({created / elapsed:,.0f} LMQs/s{', stopped by the time budget' if created < count else ''})"
        )
        await trio.to_thread.run_sync(store._index.sync)
        in_use = {f"%LMQ%q{i}" for i in range(0, created, 1000)}  # 0.1% held by readers

        async def sweep(idle_ms: int) -> tuple[list[str], float, str]:
            """Run one sweep beside a probe task; return deleted names, seconds, event-loop hold figures."""
            holds: list[float] = []
            cpu: list[float] = []  # the same gaps in this thread's CPU time (excludes being preempted)
            done = False

            async def probe() -> None:
                while not done:
                    t, c = time.perf_counter(), time.thread_time()
                    await trio.lowlevel.checkpoint()
                    holds.append(time.perf_counter() - t)
                    cpu.append(time.thread_time() - c)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe)
                await trio.lowlevel.checkpoint()
                t0 = time.perf_counter()
                deleted = await store.delete_idle_lmqs(idle_ms, in_use, limit=created)
                took = time.perf_counter() - t0
                done = True
            holds.sort()
            cpu.sort()
            p99 = holds[int(len(holds) * 0.99)] * 1000
            return (
                deleted,
                took,
                (
                    f"event-loop hold p99 {p99:.1f} ms, max {holds[-1] * 1000:.1f} ms wall "
                    f"(max {cpu[-1] * 1000:.1f} ms CPU)"
                ),
            )

        gc.collect()
        before = (du(data_dir / "index"), store._index.used_bytes(), du(data_dir / "commitlog"))
        rss_before = (rss_anon_kib(), rss_kib())
        kept, took, holds = await sweep(3_600_000)
        assert kept == []
        print(
            f"sweep, none idle: visited {created:,} LMQs in {took:.2f} s "
            f"({created / took:,.0f} LMQs/s), {holds}"
        )
        names, took, holds = await sweep(0)
        deleted = len(names)
        del names  # the returned names (~70 B each) are the caller's, not the store's, memory
        print(
            f"sweep, all idle: deleted {deleted:,} LMQs in {took:.2f} s "
            f"({deleted / took:,.0f} LMQs/s), {holds}"
        )
        await trio.to_thread.run_sync(store._index.sync)
        gc.collect()
        after = (du(data_dir / "index"), store._index.used_bytes(), du(data_dir / "commitlog"))
        rss_after = (rss_anon_kib(), rss_kib())
        _, took, holds = await sweep(0)
        print(f"sweep over the {created - deleted:,} in use: {took * 1000:.0f} ms, {holds}")
    mib = 1024 * 1024
    print(
        f"store before: index file {before[0] / mib:.1f} MiB ({before[1] / mib:.1f} MiB of pages in use, "
        f"{before[1] / created:.0f} B per LMQ incl. its parent-topic entry), "
        f"commit log {before[2] / mib:.1f} MiB "
        f"({before[2] / created:.0f} B per LMQ's one record)"
    )
    print(
        f"store bytes per idle LMQ before cleanup: {(before[1] + before[2]) / created:.0f} B "
        "(index pages + log)"
    )
    freed = (before[1] - after[1]) / max(deleted, 1)
    print(f"index pages freed per deleted LMQ: {freed:.0f} B (its name row, one entry, B-tree overhead)")
    print(
        f"store after:  index file {after[0] / mib:.1f} MiB ({after[1] / mib:.1f} MiB of pages in use; "
        f"freed pages stay in the file for reuse), commit log {after[2] / mib:.1f} MiB (no retention yet)"
    )
    print(
        f"RSS before: anon {rss_before[0] / 1024:.0f} MiB, total {rss_before[1] / 1024:.0f} MiB; "
        f"after: anon {rss_after[0] / 1024:.0f} MiB, total {rss_after[1] / 1024:.0f} MiB"
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
        if only == "sweep":
            await lmq_sweep_bench(root, int(1_000_000 * scale), 180 * scale)
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
        await lmq_sweep_bench(root, int(1_000_000 * scale), 180 * scale)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one fifth of the default sizes")
    parser.add_argument("--only", choices=["lmq", "recovery", "stall", "sweep"], help="run one part")
    args = parser.parse_args()
    trio.run(main, args.quick, args.only)
