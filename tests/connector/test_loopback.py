"""The connector between two mqproxy nodes (child processes, port 0), in-process."""

from __future__ import annotations

from collections import Counter
from typing import Any

from mqproxy.connector.origin import ORIGIN_OFFSET, PATH

from ..conftest import wait_until  # type: ignore[import-not-found]
from .conftest import Node, config, produce, read_all, rules_text, running


def seqs(messages: list[Any]) -> Counter[str]:
    return Counter(m.properties.get("seq") for m in messages)


async def test_copy_keeps_content_and_adds_origin(two_nodes: tuple[Node, Node], log_sink: Any) -> None:
    a, b = two_nodes
    await produce(a.addr, "Orders", 20)
    text = rules_text(
        a.addr, b.addr, '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "Orders"\nstart = "earliest"\n'
    )
    async with running(config(text)):
        await produce(a.addr, "Orders", 20, start=20)

        async def all_there() -> bool:
            return len(await read_all(b.addr, "Orders")) >= 40

        await wait_until(all_there)
    copied = await read_all(b.addr, "Orders")
    assert seqs(copied) == Counter(str(n) for n in range(40))
    one = next(m for m in copied if m.properties["seq"] == "7")
    assert one.body == b"m7"
    assert one.tags == "TagA"
    assert one.properties["KEYS"] == "k7"
    assert one.properties["UNIQ_KEY"] == "U00000007"
    assert one.queue_id == 7 % 4
    assert one.properties[ORIGIN_OFFSET] == str(7 // 4)
    assert one.properties[PATH] == a.addr
    batches = log_sink.named("connector.batch")
    assert sum(e["messages"] for e in batches) == 40
    assert log_sink.named("connector.started")
    assert log_sink.named("connector.stopped")


async def test_tag_and_sql_filters(two_nodes: tuple[Node, Node], log_sink: Any) -> None:
    a, b = two_nodes
    await produce(a.addr, "T1", 10, tag="x")
    await produce(a.addr, "T1", 10, tag="y", start=10)
    await produce(a.addr, "T2", 10, props={"a": "3"})
    await produce(a.addr, "T2", 10, props={"a": "9"}, start=10)
    rules = (
        '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "T1"\nfilter = "x || z"\nstart = "earliest"\n'
        '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "T2"\nsql = "a > 5"\nstart = "earliest"\n'
    )
    async with running(config(rules_text(a.addr, b.addr, rules))):

        async def copied() -> bool:
            return len(await read_all(b.addr, "T1")) >= 10 and len(await read_all(b.addr, "T2")) >= 10

        await wait_until(copied)
        await produce(a.addr, "T1", 1, tag="z", start=99)

        async def z_there() -> bool:
            return len(await read_all(b.addr, "T1")) >= 11

        await wait_until(z_there)
    assert seqs(await read_all(b.addr, "T1")) == Counter([*(str(n) for n in range(10)), "99"])
    assert seqs(await read_all(b.addr, "T2")) == Counter(str(n) for n in range(10, 20))


async def test_regex_rule_picks_up_new_topic_and_target_topic(
    two_nodes: tuple[Node, Node], log_sink: Any
) -> None:
    a, b = two_nodes
    await produce(a.addr, "Evt-1", 5)
    rules = '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "re:Evt-.*"\nstart = "earliest"\n'
    async with running(config(rules_text(a.addr, b.addr, rules))):

        async def first() -> bool:
            return len(await read_all(b.addr, "Evt-1")) == 5

        await wait_until(first)
        await produce(a.addr, "Evt-2", 6, queues=2)  # created while running: copied from its start

        async def second() -> bool:
            return len(await read_all(b.addr, "Evt-2")) == 6

        await wait_until(second)
    created = {e["topic"]: e["queues"] for e in log_sink.named("connector.topic_created")}
    assert created == {"Evt-1": 4, "Evt-2": 2}


async def test_start_latest_and_timestamp(two_nodes: tuple[Node, Node], log_sink: Any) -> None:
    import time

    a, b = two_nodes
    await produce(a.addr, "L", 8)
    await produce(a.addr, "S", 8)
    cut = int(time.time() * 1000) + 1
    await wait_until(lambda: int(time.time() * 1000) > cut)
    await produce(a.addr, "S", 8, start=8)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cut / 1000)) + f".{cut % 1000:03d}Z"
    rules = (
        '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "L"\n'
        f'[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "S"\nstart = "{stamp}"\n'
    )
    async with running(config(rules_text(a.addr, b.addr, rules))):
        await wait_until(lambda: len(log_sink.named("connector.queues")) >= 2)

        async def recovered() -> bool:
            return len(await read_all(b.addr, "S")) >= 8

        await wait_until(recovered)
        await wait_until(lambda: len({e["rule"] for e in log_sink.named("connector.lag")}) >= 2)
        await produce(a.addr, "L", 4, start=100)

        async def latest() -> bool:
            return len(await read_all(b.addr, "L")) >= 4

        await wait_until(latest)
    assert seqs(await read_all(b.addr, "L")) == Counter(str(n) for n in range(100, 104))
    assert seqs(await read_all(b.addr, "S")) == Counter(str(n) for n in range(8, 16))


async def test_two_opposite_rules_do_not_ping_pong(two_nodes: tuple[Node, Node], log_sink: Any) -> None:
    a, b = two_nodes
    await produce(a.addr, "P", 6)
    await produce(b.addr, "P", 4, start=100)
    rules = (
        '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "P"\nstart = "earliest"\n'
        '[[rules]]\nsource = "b"\ntarget = "a"\ntopic = "P"\nstart = "earliest"\n'
    )
    async with running(config(rules_text(a.addr, b.addr, rules))):

        async def both() -> bool:
            return len(await read_all(a.addr, "P")) >= 10 and len(await read_all(b.addr, "P")) >= 10

        await wait_until(both)
        # quiet: every queue caught up (lag 0 reported after the last copy) and nothing more was copied
        marker = len(log_sink.lines)

        def settled() -> bool:
            lags = [e for e in log_sink.events[marker:] if e["event"] == "connector.lag"]
            return len(lags) >= 16 and all(e["lag"] == 0 for e in lags[-16:])

        await wait_until(settled)
    expected = Counter([*(str(n) for n in range(6)), *(str(n) for n in range(100, 104))])
    assert seqs(await read_all(a.addr, "P")) == expected
    assert seqs(await read_all(b.addr, "P")) == expected


async def test_refused_message_goes_to_dead_letter_topic(node_factory: Any, log_sink: Any) -> None:
    a = node_factory("a")
    b = node_factory("b", env={"MQPROXY_STORE_MAX_MESSAGE_BYTES": "2048"})
    await produce(a.addr, "D", 3, queues=1)
    await produce(a.addr, "D", 1, body=b"z" * 5000, start=3)
    await produce(a.addr, "D", 2, start=4)
    rules = '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "D"\nstart = "earliest"\n'
    async with running(config(rules_text(a.addr, b.addr, rules))):

        async def copied() -> bool:
            return (
                len(await read_all(b.addr, "D")) >= 5 and len(await read_all(b.addr, "CONNECTOR_DLQ_c1")) >= 1
            )

        await wait_until(copied)
    assert seqs(await read_all(b.addr, "D")) == Counter(["0", "1", "2", "4", "5"])
    [dead] = await read_all(b.addr, "CONNECTOR_DLQ_c1")
    assert dead.properties["seq"] == "3"
    assert "CONNECTOR_DLQ_REASON" in dead.properties
    [event] = log_sink.named("connector.dead_letter")
    assert event["offset"] == 3
    assert event["dlq_topic"] == "CONNECTOR_DLQ_c1"
