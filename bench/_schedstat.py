"""How long the threads of some processes waited for a CPU while runnable, from Linux's
``/proc/PID/task/TID/schedstat`` (CPU time on a CPU, time waiting on a run queue, timeslices run; all
since the thread started). :func:`sample` reads every thread of the given processes, grouped by thread
name without its trailing number (``PullMessageThread_3`` -> ``PullMessageThread``); :func:`since`
subtracts an earlier sample (threads that started meanwhile count from zero, ended ones are gone).

Used by ``bench/vs_rocketmq.py``'s drain case: a one-thread server that is idle most of a drain can still
answer late when its thread, once woken, waits for a CPU behind other runnable threads.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["Sample", "format_waits", "sample", "since"]

#: (pid, tid) -> (group name, cpu ns, run-queue wait ns, timeslices)
Sample = dict[tuple[int, int], tuple[str, int, int, int]]

_TRAILING = re.compile(r"[-_#]?\d+$")


def sample(pids: list[int]) -> Sample:
    """Every live thread of ``pids``; missing processes or threads are skipped."""
    out: Sample = {}
    for pid in pids:
        try:
            tids = [int(p.name) for p in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            base = Path(f"/proc/{pid}/task/{tid}")
            try:
                name = (base / "comm").read_text().strip()
                cpu, wait, slices = (int(x) for x in (base / "schedstat").read_text().split()[:3])
            except (OSError, ValueError):
                continue
            out[(pid, tid)] = (_TRAILING.sub("", name) or name, cpu, wait, slices)
    return out


def since(before: Sample, after: Sample) -> dict[str, tuple[float, float, int, int]]:
    """Per thread-name group: (CPU ms, run-queue wait ms, timeslices, threads that ran) between the
    samples."""
    groups: dict[str, tuple[float, float, int, int]] = {}
    for key, (name, cpu, wait, slices) in after.items():
        _, cpu0, wait0, slices0 = before.get(key, (name, 0, 0, 0))
        if slices == slices0:
            continue
        c, w, s, n = groups.get(name, (0.0, 0.0, 0, 0))
        groups[name] = (c + (cpu - cpu0) / 1e6, w + (wait - wait0) / 1e6, s + slices - slices0, n + 1)
    return groups


def format_waits(groups: dict[str, tuple[float, float, int, int]], top: int = 4) -> str:
    """The ``top`` groups by CPU: ``name xN cpu C ms, waited W ms over S slices (W/S ms each)``."""
    parts = []
    for name, (cpu, wait, slices, threads) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        each = wait / slices if slices else 0.0
        waited = f"waited {wait:.0f} ms over {slices} slices ({each:.2f} ms each)"
        parts.append(f"{name} x{threads}: cpu {cpu:.0f} ms, {waited}")
    return "; ".join(parts) or "no thread ran"
