"""Consumer-offset translation between two mqproxy nodes (child processes, port 0), connector in-process:
committed source offsets land on the target at the first copy at or after them, filtered-out messages do
not count, a target group never moves backwards, unselected groups are left alone."""

from __future__ import annotations

from typing import Any

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import Node, cluster, config, produce, read_all, rules_text, running

TOPIC = "Orders"
#: seq n goes to queue n % 4 at source offset n // 4; seqs 4 and 8 (queue 0, offsets 1 and 2) are filtered out
FILTERED = {4, 8}


async def target_offsets(addr: str, group: str) -> dict[int, int | None]:
    async with cluster(addr) as c:
        return {q: await c.query_offset(group, TOPIC, "broker-a", q) for q in range(4)}


async def commit(addr: str, group: str, offsets: dict[int, int]) -> None:
    async with cluster(addr) as c:
        for q, offset in offsets.items():
            await c.commit_offset(group, TOPIC, "broker-a", q, offset)


async def test_offsets_translate_to_the_target(two_nodes: tuple[Node, Node], log_sink: Any) -> None:
    a, b = two_nodes
    for n in range(40):
        await produce(a.addr, TOPIC, 1, start=n, tag="B" if n in FILTERED else "A")
    await commit(a.addr, "G1", {0: 1, 1: 10, 2: 4})  # queue 3: never consumed
    await commit(a.addr, "app-x", {0: 5, 1: 0, 2: 0, 3: 0})
    await commit(a.addr, "other", {0: 5, 1: 5, 2: 5, 3: 5})
    rules = (
        f'[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "{TOPIC}"\nfilter = "A"\nstart = "earliest"\n'
        'groups = ["G1", "re:app-.*"]\n'
    )
    text = rules_text(a.addr, b.addr, rules, "checkpoint_interval_s = 0.2")
    async with cluster(b.addr) as c:  # the target group went further on its own already
        await c.create_topic(TOPIC, 4)
        await c.commit_offset("G1", TOPIC, "broker-a", 2, 8)
    async with running(config(text)):

        async def copied() -> bool:
            return len(await read_all(b.addr, TOPIC)) >= 38

        await wait_until(copied)

        async def translated() -> bool:
            g1, app = await target_offsets(b.addr, "G1"), await target_offsets(b.addr, "app-x")
            return g1[0] is not None and g1[1] is not None and app[0] is not None and app[3] is not None

        await wait_until(translated)
        # target queue 0 holds origins 0, 3, 4, ..., 9 at target offsets 0..7
        assert await target_offsets(b.addr, "G1") == {0: 1, 1: 10, 2: 8, 3: None}
        assert await target_offsets(b.addr, "app-x") == {0: 3, 1: 0, 2: 0, 3: 0}
        assert await target_offsets(b.addr, "other") == {0: None, 1: None, 2: None, 3: None}

        await commit(a.addr, "G1", {0: 9})

        async def moved() -> bool:
            return (await target_offsets(b.addr, "G1"))[0] == 7

        await wait_until(moved)
        await produce(a.addr, TOPIC, 1, start=40, tag="A")  # queue 0, source offset 10 → target offset 8
        await commit(a.addr, "G1", {0: 11})

        async def tail() -> bool:
            return (await target_offsets(b.addr, "G1"))[0] == 9

        await wait_until(tail)
        # a filtered-out message (source offset 11) has no copy: consumed through 13, the group resumes
        # after the copy of source offset 12 (target offset 9)
        await produce(a.addr, TOPIC, 1, start=44, tag="B")
        await produce(a.addr, TOPIC, 1, start=48, tag="A")
        await commit(a.addr, "G1", {0: 13})

        async def after() -> bool:
            return (await target_offsets(b.addr, "G1"))[0] == 10

        await wait_until(after)
    events = log_sink.named("connector.checkpoint")
    assert {(e["group"], e["source_queue"], e["source_offset"], e["target_offset"]) for e in events} >= {
        ("G1", "broker-a:0", 1, 1),
        ("G1", "broker-a:1", 10, 10),
        ("app-x", "broker-a:0", 5, 3),
        ("G1", "broker-a:0", 9, 7),
        ("G1", "broker-a:0", 11, 9),
        ("G1", "broker-a:0", 13, 10),
    }
    assert not [e for e in events if e["group"] == "G1" and e["source_queue"] == "broker-a:2"]
    assert all(e["group"] != "other" for e in events)
    one = events[0]
    assert (one["connector"], one["rule"], one["topic"], one["target_topic"]) == (
        "c1",
        "a->b:Orders",
        TOPIC,
        TOPIC,
    )
