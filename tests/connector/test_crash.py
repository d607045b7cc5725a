"""Exactly once across ``kill -9``, and work shared between connector processes (slow tier)."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
import trio

from ..conftest import wait_until_sync  # type: ignore[import-not-found]
from .conftest import ConnectProcess, Node, produce, read_all, rules_text

pytestmark = pytest.mark.slow

RULE = '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "K"\nstart = "earliest"\n'


def copied_by(proc: ConnectProcess) -> int:
    return sum(e["messages"] for e in proc.events("connector.batch"))


def target_count(b: Node) -> int:
    return len(trio.run(read_all, b.addr, "K"))


#: Messages copied while the connector is killed twice (early, at 120 and 330 copied): enough that a fast
#: machine cannot finish the copy between two polls of the target.
COPIED = 2400


def test_kill_9_twice_during_a_long_copy_neither_loses_nor_duplicates(
    two_nodes: tuple[Node, Node], tmp_path: Path
) -> None:
    a, b = two_nodes
    trio.run(produce, a.addr, "K", COPIED)
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(a.addr, b.addr, RULE, connector="batch_messages = 4"))
    for run, kill_after in enumerate((120, 330)):
        proc = ConnectProcess(rules, tmp_path / f"run{run}.log")
        try:
            proc.wait_started()
            wait_until_sync(lambda n=kill_after: target_count(b) >= n, poll_s=0.005)  # type: ignore[misc]
            proc.kill()
        finally:
            proc.close()
        assert target_count(b) < COPIED, "the copy finished before the kill: make it slower"
    last = ConnectProcess(rules, tmp_path / "run2.log")
    try:
        last.wait_started()
        wait_until_sync(lambda: target_count(b) >= COPIED and bool(last.events("connector.lag")))
        lags = last.events("connector.lag")
        wait_until_sync(lambda: len(last.events("connector.lag")) >= len(lags) + 4)
        assert last.terminate() == 0
    finally:
        last.close()
    seqs = Counter(m.properties["seq"] for m in trio.run(read_all, b.addr, "K"))
    assert seqs == Counter(str(n) for n in range(COPIED)), {k: v for k, v in seqs.items() if v != 1}


def test_two_processes_share_the_work_and_one_takes_over_after_a_kill(
    two_nodes: tuple[Node, Node], tmp_path: Path
) -> None:
    a, b = two_nodes
    trio.run(produce, a.addr, "K", 40)
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(a.addr, b.addr, RULE, connector="batch_messages = 4"))
    one = ConnectProcess(rules, tmp_path / "one.log")
    two = ConnectProcess(rules, tmp_path / "two.log")
    try:
        one.wait_started()
        two.wait_started()

        def owned(proc: ConnectProcess) -> int:
            found = proc.events("connector.queues")
            return found[-1]["owned"] if found else 0

        wait_until_sync(lambda: owned(one) == 2 and owned(two) == 2)
        wait_until_sync(lambda: target_count(b) >= 40)
        two.kill()
        wait_until_sync(lambda: owned(one) == 4)
        trio.run(functools.partial(produce, a.addr, "K", 40, start=40))
        wait_until_sync(lambda: target_count(b) >= 80)
        assert one.terminate() == 0
    finally:
        one.close()
        two.close()
    seqs = Counter(m.properties["seq"] for m in trio.run(read_all, b.addr, "K"))
    assert seqs == Counter(str(n) for n in range(80))
