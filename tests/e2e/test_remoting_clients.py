"""Real RocketMQ 4.x remoting clients against a real ``mqproxy serve`` subprocess over loopback.

Clients (installed by ``scripts/setup-clients.sh``; driven by ``tests/e2e/clients/``):
``py044`` PyPI rocketmq==0.4.4 (C++ core, SEND_MESSAGE 10), ``pycvs`` PyPI rocketmq-python-cvs==2.1.0.3
(C++ 2.1 core, SEND_MESSAGE_V2 310), ``alions`` npm ali-ons@3.12.0 (pure JS, 310, numeric/boolean extFields).

Every test produces before it consumes with a new consumer group, which relies on the broker rule that
QUERY_CONSUMER_OFFSET for an unknown group on a queue that still holds offset 0 answers ``offset=0``
(otherwise CONSUME_FROM_LAST_OFFSET clients would start at the end and miss the batch).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

CLIENTS = ("py044", "pycvs", "alions")
CPP = frozenset({"py044", "pycvs"})
COUNT = 20
PROP_KEYS = ("color", "origin")
SEND_OK = frozenset({"OK", "SEND_OK"})  # C++ binding enum name / ali-ons status string
SEGFAULT = frozenset({-11, 139})
# C++ cores persist offsets on a 5 s timer only (the drivers skip shutdown: it segfaults in 2.1).
CPP_COMMIT_WAIT = 6.5
_serial = itertools.count()

Expected = dict[tuple[str, int], dict[str, Any]]
Event = dict[str, Any]


def unique(prefix: str) -> str:
    """A topic/group name no other test uses (valid charset: letters, digits, '-', '_')."""
    return f"{prefix}_{next(_serial)}_{uuid.uuid4().hex[:8]}"


def expected_messages(topic: str, producer: str, start: int, count: int) -> Expected:
    """What a consumer must see for each message of ``send_batch(start=start)``, keyed by (origin, seq)."""
    return {
        (producer, i): {
            "topic": topic,
            "tags": f"Tag{producer}",
            "keys": f"order-{producer}-{i}",
            "body": f"körper {producer} {start}-{i}",  # the driver appends "-<seq>" to --body
            "properties": {"color": "rot-grün", "origin": producer, "seq": str(i)},
            "reconsume_times": 0,
        }
        for i in range(start, start + count)
    }


def send_batch(client: Any, namesrv: str, topic: str, start: int = 0, count: int = COUNT) -> list[Event]:
    """Produce ``count`` messages whose content ``expected_messages`` predicts; return the acks."""
    name = client.name
    run = client.produce(namesrv, topic, count, start=start, tag=f"Tag{name}", key=f"order-{name}",
                         body=f"körper {name} {start}", props={"color": "rot-grün", "origin": name})
    assert run.returncode == 0, run.describe()
    acks = run.of("sent")
    assert [a["index"] for a in acks] == list(range(start, start + count)), run.describe()
    assert {a["status"] for a in acks} <= SEND_OK, run.describe()
    assert len({a["msg_id"] for a in acks}) == count, f"duplicate send msg ids: {acks}"
    return acks


def finished(client: Any, run: Any, timeout: float = 60.0) -> list[Event]:
    """Wait for a consumer run; check it reached its count and exited normally; return what it received."""
    run.wait(timeout)
    done = run.done()
    assert done is not None, run.describe()
    assert not done["timed_out"], run.describe()
    allowed = {0} | (SEGFAULT if client.segfaults_on_exit else set())
    assert run.returncode in allowed, run.describe()
    return run.of("received")


def consume(client: Any, namesrv: str, topic: str, group: str, expect: int, *, linger: float = 0.0) -> Any:
    """Start a push consumer that reports the user properties ``send_batch`` sets."""
    return client.consume(namesrv, topic, group, expect, timeout=20, linger=linger, prop_keys=PROP_KEYS)


def seqs_of(received: list[Event]) -> list[int]:
    return sorted(int(e["properties"]["seq"]) for e in received)


def assert_content(received: list[Event], expected: Expected) -> None:
    got = {(e["properties"].get("origin", "?"), int(e["properties"].get("seq", -1))): e for e in received}
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    assert missing == [], f"messages not delivered: {missing}"
    assert extra == [], f"messages never sent: {extra}"
    for ident, want in expected.items():
        seen = {k: got[ident].get(k) for k in want}
        assert seen == want, f"message {ident} altered in transit"


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("consumer", CLIENTS)
@pytest.mark.parametrize("producer", CLIENTS)
def test_push_consumer_receives_every_message_intact(
    proxy: Any, client: Callable[[str], Any], producer: str, consumer: str
) -> None:
    """20 sends with keys, tag and user properties; a push consumer of a new group sees each one unchanged."""
    prod, cons = client(producer), client(consumer)
    topic, group = unique("Intact"), unique("GIntact")

    acks = send_batch(prod, proxy.address, topic)
    run = consume(cons, proxy.address, topic, group, COUNT, linger=1.0)
    received = finished(cons, run)

    assert len(received) == COUNT, f"redelivered within one consumer:\n{run.describe()}"
    assert_content(received, expected_messages(topic, producer, 0, COUNT))
    assert len({e["msg_id"] for e in received}) == COUNT
    assert len({(e["queue_id"], e["queue_offset"]) for e in received}) == COUNT, "two messages share a slot"
    # The id a producer is given must be the id its own family of consumer shows (C++: UNIQ_KEY, ali-ons:
    # offset msg id rebuilt from the record's store host and commit-log offset).
    if (producer in CPP) == (consumer in CPP):
        assert {e["msg_id"] for e in received} == {a["msg_id"] for a in acks}


@pytest.mark.parametrize("name", CLIENTS)
def test_second_consumer_resumes_from_committed_offsets(
    proxy: Any, client: Callable[[str], Any], name: str
) -> None:
    """A group's committed offsets are honoured by the next consumer of that group."""
    cli = client(name)
    topic, group = unique("Resume"), unique("GResume")
    linger = CPP_COMMIT_WAIT if name in CPP else 0.0

    send_batch(cli, proxy.address, topic, start=0)
    first = finished(cli, consume(cli, proxy.address, topic, group, COUNT, linger=linger))
    assert seqs_of(first) == list(range(COUNT))

    send_batch(cli, proxy.address, topic, start=COUNT)
    second = finished(cli, consume(cli, proxy.address, topic, group, COUNT, linger=1.5))
    assert seqs_of(second) == list(range(COUNT, 2 * COUNT)), "second consumer of the group re-read batch 1"
    assert_content(second, expected_messages(topic, name, COUNT, COUNT))


def test_restart_between_produce_and_consume_loses_nothing(
    new_proxy: Callable[[], Any], client: Callable[[str], Any]
) -> None:
    """Messages from every client survive SIGTERM + restart on the same data dir and port."""
    producers = [client(name) for name in CLIENTS]
    consumers = [client("pycvs"), client("alions")]
    proxy = new_proxy()
    topic = unique("Restart")

    expected: Expected = {}
    for prod in producers:
        send_batch(prod, proxy.address, topic)
        expected |= expected_messages(topic, prod.name, 0, COUNT)
    address = proxy.address
    assert proxy.restart() == address

    total = len(expected)
    runs = [consume(c, address, topic, unique("GRestart"), total, linger=1.0) for c in consumers]
    for cons, run in zip(consumers, runs, strict=True):
        received = finished(cons, run, timeout=70)
        assert len(received) == total, run.describe()
        assert_content(received, expected)


def test_committed_offsets_survive_restart(
    new_proxy: Callable[[], Any], client: Callable[[str], Any]
) -> None:
    """Offsets committed before a graceful restart are honoured after it."""
    cli = client("alions")  # closes cleanly: offsets are committed on close, no timer wait
    proxy = new_proxy()
    topic, group = unique("ResumeRestart"), unique("GResumeRestart")

    send_batch(cli, proxy.address, topic, start=0)
    assert seqs_of(finished(cli, consume(cli, proxy.address, topic, group, COUNT))) == list(range(COUNT))
    proxy.restart()

    send_batch(cli, proxy.address, topic, start=COUNT, count=5)
    after = finished(cli, consume(cli, proxy.address, topic, group, 5, linger=1.5))
    assert seqs_of(after) == list(range(COUNT, COUNT + 5)), "after the restart the group re-read batch 1"
