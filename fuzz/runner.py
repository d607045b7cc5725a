"""
mqproxy.fuzz.runner
~~~~~~~~~~~~~~~~~~~

Runs fuzz targets: chunks of deterministic inputs spread over worker processes.

Contract of one input: ``target.run(data, split)`` returns or raises one of ``target.errors``. Anything
else is a :class:`Finding`: another exception (``crash``), an input still running after
``input_cap_s`` (``hang``: a ``SIGALRM`` interrupts it), or memory a window of inputs left behind
(``leak``: ``tracemalloc`` over the last ``leak_window`` inputs of every chunk, after a ``gc.collect()``,
must retain at most ``leak_bytes``). A chunk is reproducible from ``(seed, target, chunk)`` alone, and each
crash or hang keeps the shortest input seen for its (exception, location) and is shrunk by
:func:`minimize` before it is reported.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import resource
import signal
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType

from mqproxy.fuzz.mutator import Mutator
from mqproxy.fuzz.targets import TARGETS, Target

__all__ = [
    "ChunkResult", "Finding", "FuzzSettings", "RssTracker", "TargetReport", "fuzz", "minimize", "reproduce",
]


@dataclass(frozen=True, slots=True)
class FuzzSettings:
    inputs: int = 1_000_000
    workers: int = 2
    seed: int = 1
    chunk: int = 25_000
    input_cap_s: float = 2.0
    leak_window: int = 1_000
    leak_bytes: int = 64 * 1024
    #: A chunk that reports nothing for this long means a worker is stuck where SIGALRM cannot reach.
    chunk_timeout_s: float = 600.0


@dataclass(slots=True)
class Finding:
    target: str
    kind: str  # crash | hang | leak | stuck
    key: str  # exception type and innermost location, or a description
    data: bytes = b""
    split: int = 0
    detail: str = ""


@dataclass(slots=True)
class ChunkResult:
    target: str
    inputs: int
    wall_s: float
    max_input_ms: float
    retained_bytes: int
    rss_kib: int
    findings: list[Finding] = field(default_factory=list)
    pid: int = field(default_factory=os.getpid)


@dataclass(slots=True)
class TargetReport:
    target: str
    inputs: int = 0
    busy_s: float = 0.0  # summed chunk wall time (one core each)
    max_input_ms: float = 0.0
    max_retained_bytes: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def per_core_rate(self) -> float:
        return self.inputs / self.busy_s if self.busy_s else 0.0


class Hang(BaseException):
    """Raised by SIGALRM inside an input that ran past the cap (BaseException: no codec catches it)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang


class _AlarmOwner:
    """Borrows ``SIGALRM`` and the real-time interval timer, then gives back both: the handler and what was
    left of a timer someone else had armed (pytest-timeout's, in a test process)."""

    def __enter__(self) -> None:
        self._handler = signal.signal(signal.SIGALRM, _on_alarm)
        self._timer = signal.getitimer(signal.ITIMER_REAL)[0]
        self._since = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._handler)
        if self._timer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(self._timer - (time.monotonic() - self._since), 0.001))


def _key(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def _inputs(target: Target, seed: int, chunk: int, count: int) -> Iterable[tuple[bytes, int]]:
    rng = random.Random(f"{seed}:{target.name}:{chunk}")
    mutator = Mutator(rng, _seeds(target.name), target.max_len)
    for _ in range(count):
        data = mutator.mutate()
        yield data, (rng.randrange(len(data) + 1) if rng.random() < 0.3 else 0)


_SEED_CACHE: dict[str, list] = {}  # type: ignore[type-arg]


def _seeds(name: str) -> list:  # type: ignore[type-arg]
    if name not in _SEED_CACHE:
        _SEED_CACHE[name] = TARGETS[name].seeds()
    return _SEED_CACHE[name]


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def run_chunk(args: tuple[str, int, int, int, FuzzSettings]) -> ChunkResult:
    """Run inputs ``chunk * settings.chunk ...`` of one target in this process (a pool worker)."""
    name, seed, chunk, count, settings = args
    target = TARGETS[name]
    run, allowed = target.run, target.errors
    found: dict[str, Finding] = {}
    window_at = max(count - settings.leak_window, 0)
    retained = 0
    slowest = 0.0
    started = time.perf_counter()
    with _AlarmOwner():
        for index, (data, split) in enumerate(_inputs(target, seed, chunk, count)):
            if index == window_at:
                gc.collect()
                tracemalloc.start()
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, settings.input_cap_s)
            try:
                run(data, split)
            except allowed:
                pass
            except Hang:
                _keep(found, Finding(name, "hang", f"over {settings.input_cap_s} s", data, split))
            except Exception as exc:
                _keep(found, Finding(name, "crash", _key(exc), data, split, repr(exc)[:300]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            slowest = max(slowest, time.perf_counter() - t0)
        if tracemalloc.is_tracing():
            gc.collect()
            retained = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
    findings = list(found.values())
    if retained > settings.leak_bytes:
        findings.append(Finding(name, "leak", f"{retained} bytes retained by {settings.leak_window} inputs"))
    return ChunkResult(name, count, time.perf_counter() - started, slowest * 1000, retained, _rss_kib(),
                       findings)


def _keep(found: dict[str, Finding], finding: Finding) -> None:
    known = found.get(finding.key)
    if known is None or len(finding.data) < len(known.data):
        found[finding.key] = finding


def reproduce(target: Target, data: bytes, split: int, cap_s: float = 2.0) -> str | None:
    """The finding key ``data`` triggers on ``target`` (None: decodes or fails as documented)."""
    try:
        run_with_cap(target.run, data, split, cap_s)
    except target.errors:
        return None
    except Hang:
        return "hang"
    except Exception as exc:
        return _key(exc)
    return None


def run_with_cap(run: Callable[[bytes, int], None], data: bytes, split: int, cap_s: float) -> None:
    with _AlarmOwner():
        signal.setitimer(signal.ITIMER_REAL, cap_s)
        try:
            run(data, split)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def minimize(target: Target, finding: Finding, budget: int = 4000, cap_s: float = 2.0) -> Finding:
    """Shrink ``finding.data`` (drop ranges, then zero bytes) while it keeps triggering the same key."""
    want = finding.key if finding.kind == "crash" else "hang"
    data, split = finding.data, finding.split
    tries = 0

    def same(candidate: bytes, cut: int) -> bool:
        nonlocal tries
        tries += 1
        return reproduce(target, candidate, min(cut, len(candidate)), cap_s) == want

    size = max(len(data) // 2, 1)
    while size >= 1 and tries < budget:
        at = 0
        while at < len(data) and tries < budget:
            candidate = data[:at] + data[at + size :]
            cut = split if split <= at else max(split - size, 0)
            if same(candidate, cut):
                data, split = candidate, min(cut, len(candidate))
            else:
                at += size
        size //= 2
    if split and same(data, 0):
        split = 0
    return Finding(finding.target, finding.kind, finding.key, data, split, finding.detail)


@dataclass(slots=True)
class RssTracker:
    """Resident memory of each worker after its first chunk and after its latest one."""

    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)

    def __call__(self, result: ChunkResult) -> None:
        self.first.setdefault(result.pid, result.rss_kib)
        self.last[result.pid] = result.rss_kib

    @property
    def growth_kib(self) -> int:
        """The largest growth of one worker's RSS over the run, first chunk excluded (imports, caches)."""
        return max((self.last[pid] - self.first[pid] for pid in self.first), default=0)


def fuzz(
    names: Iterable[str], settings: FuzzSettings, progress: Callable[[ChunkResult], None] | None = None
) -> tuple[list[TargetReport], float]:
    """Fuzz every named target with ``settings.inputs`` inputs; returns the reports and the wall time.
    ``progress`` sees every chunk's result as it arrives (e.g. an :class:`RssTracker`)."""
    reports = {name: TargetReport(name) for name in names}
    tasks = []
    for name in reports:
        TARGETS[name]
        for chunk, start in enumerate(range(0, settings.inputs, settings.chunk)):
            tasks.append((name, settings.seed, chunk, min(settings.chunk, settings.inputs - start), settings))
    started = time.perf_counter()
    results: Iterable[ChunkResult]
    if settings.workers <= 1:
        results = map(run_chunk, tasks)
        _collect(results, reports, progress, None)
    else:
        with multiprocessing.get_context("fork").Pool(settings.workers) as pool:
            _collect(pool.imap_unordered(run_chunk, tasks), reports, progress, settings.chunk_timeout_s)
    wall = time.perf_counter() - started
    for report in reports.values():
        target = TARGETS[report.target]
        cap = settings.input_cap_s
        report.findings = [minimize(target, f, cap_s=cap) if f.kind in ("crash", "hang") else f
                           for f in report.findings]
    return list(reports.values()), wall


def _collect(
    results: Iterable[ChunkResult], reports: dict[str, TargetReport],
    progress: Callable[[ChunkResult], None] | None, timeout_s: float | None,
) -> None:
    iterator = iter(results)
    while True:
        try:
            result = iterator.next(timeout_s) if timeout_s is not None else next(iterator)  # type: ignore[attr-defined]
        except StopIteration:
            return
        except multiprocessing.TimeoutError:
            for report in reports.values():
                report.findings.append(Finding(report.target, "stuck", f"no chunk finished in {timeout_s} s"))
            return
        report = reports[result.target]
        report.inputs += result.inputs
        report.busy_s += result.wall_s
        report.max_input_ms = max(report.max_input_ms, result.max_input_ms)
        report.max_retained_bytes = max(report.max_retained_bytes, result.retained_bytes)
        seen = {f.key: f for f in report.findings}
        for finding in result.findings:
            known = seen.get(finding.key)
            if known is None or len(finding.data) < len(known.data):
                seen[finding.key] = finding
        report.findings = list(seen.values())
        if progress is not None:
            progress(result)
