"""``bench/_schedstat.py``: run-queue waits per thread group between two samples of
``/proc/PID/task/TID/schedstat`` (the drain rows of ``bench/vs_rocketmq.py``)."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _schedstat import format_waits, sample, since  # type: ignore[import-not-found]


def test_since_groups_threads_by_name_without_their_number_and_skips_threads_that_did_not_run() -> None:
    before = {
        (1, 1): ("PullMessageThread", 1_000_000, 2_000_000, 10),
        (1, 2): ("PullMessageThread", 0, 0, 1),
        (1, 3): ("idle", 5, 5, 5),
    }
    after = {
        (1, 1): ("PullMessageThread", 3_000_000, 2_500_000, 12),
        (1, 2): ("PullMessageThread", 1_000_000, 1_500_000, 3),
        (1, 3): ("idle", 5, 5, 5),  # no slice since: left out
        (1, 4): ("new", 2_000_000, 4_000_000, 2),  # started meanwhile: counted from zero
    }
    groups = since(before, after)
    assert groups == {"PullMessageThread": (3.0, 2.0, 4, 2), "new": (2.0, 4.0, 2, 1)}
    assert format_waits(groups, top=1) == (
        "PullMessageThread x2: cpu 3 ms, waited 2 ms over 4 slices (0.50 ms each)"
    )
    assert format_waits({}) == "no thread ran"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_sample_reads_every_thread_of_a_process_and_strips_trailing_numbers() -> None:
    named, stop = threading.Event(), threading.Event()

    def work() -> None:  # the OS thread name (comm) is what schedstat readers see: PR_SET_NAME
        ctypes.CDLL(None).prctl(15, b"worker_7", 0, 0, 0)
        named.set()
        stop.wait()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        assert named.wait(10)
        threads = sample([os.getpid(), 2**22 + 1])  # a pid that does not exist is skipped
    finally:
        stop.set()
        worker.join()
    names = {name for name, *_ in threads.values()}
    assert "worker" in names
    assert all(pid == os.getpid() for pid, _ in threads)
    assert all(cpu >= 0 and wait >= 0 and slices >= 0 for _, cpu, wait, slices in threads.values())
