"""QoS 2 state in session snapshots: JSON round trip, old records, bad records, serialized writes, and how
a Session puts restored deliveries back on its cursors."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.mqtt import NO_PROPERTIES, Publish, QoS
from mqproxy.model.types import Message, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC, encode_properties
from mqproxy.mqtt.session import Session
from mqproxy.mqtt.session_record import (
    COMPLETE,
    RELEASED,
    SENT,
    InboundQos2,
    OutboundQos2,
    SessionSnapshot,
    SubscriptionSpec,
)
from mqproxy.mqtt.shared import SharedGroup
from mqproxy.mqtt.state import SessionStateStore

from ..conftest import wait_until  # type: ignore[import-not-found]

Q2 = QoS.EXACTLY_ONCE


def test_snapshot_round_trip_with_qos2_state() -> None:
    snapshot = SessionSnapshot(
        "dev",
        600,
        [SubscriptionSpec("a/+", 2)],
        None,
        awaiting_rel=[InboundQos2(3), InboundQos2(9, "%LMQ%a%b", 40)],
        outbound=[
            OutboundQos2(5, "a/+", 17, SENT),
            OutboundQos2(6, "a/+", 18, RELEASED),
            OutboundQos2(7, "a/+", 9000, SENT, retained=True),
        ],
    )
    data = snapshot.to_json()
    assert json.loads(data)["outbound"] == [[5, "a/+", 17, 0], [6, "a/+", 18, 1], [7, "a/+", 9000, 0, 1]]
    assert json.loads(data)["awaiting_rel"] == [[3, "", 0], [9, "%LMQ%a%b", 40]]
    assert SessionSnapshot.from_json(data) == snapshot


def test_snapshot_without_qos2_state_omits_the_fields() -> None:
    data = SessionSnapshot("dev", 60, [SubscriptionSpec("x", 1)]).to_json()
    assert data == (
        b'{"client_id":"dev","expiry_interval":60,"subscriptions":[{"topic_filter":"x","qos":1,'
        b'"no_local":false,"retain_as_published":false,"retain_handling":0,"subscription_id":null}],'
        b'"disconnected_at_ms":null,"deleted":false}'
    )


def test_old_record_format_still_loads() -> None:
    old = (
        b'{"client_id":"legacy","expiry_interval":4294967295,"subscriptions":[{"topic_filter":"t/#",'
        b'"qos":2,"no_local":false,"retain_as_published":false,"retain_handling":0,'
        b'"subscription_id":null}],"disconnected_at_ms":1700000000000,"deleted":false}'
    )
    snapshot = SessionSnapshot.from_json(old)
    assert snapshot.client_id == "legacy"
    assert snapshot.subscriptions == [SubscriptionSpec("t/#", 2)]
    assert snapshot.awaiting_rel == []
    assert snapshot.outbound == []


def test_outbound_records_name_a_queue_other_than_0_compatibly() -> None:
    """A cluster's LMQ has a queue per broker: a record of queue 0 keeps the earlier wire form."""
    records = [
        OutboundQos2(1, "a", 2),
        OutboundQos2(2, "a", 3, RELEASED, queue_id=1),
        OutboundQos2(3, "r", 9, SENT, True, queue_id=2),
        OutboundQos2(0, "a", 4, COMPLETE, queue_id=1),
    ]
    wire = [r.to_list() for r in records]
    assert wire == [[1, "a", 2, 0], [2, "a", 3, 1, 0, 1], [3, "r", 9, 0, 1, 2], [0, "a", 4, 2, 0, 1]]
    assert [OutboundQos2.from_list(w) for w in wire] == records
    assert OutboundQos2.from_list([1, "a", 2, 0, 1]) == OutboundQos2(1, "a", 2, SENT, True)


@pytest.mark.parametrize(
    "extra",
    [
        {"awaiting_rel": [[0, "", 0]]},
        {"awaiting_rel": [[70000, "", 0]]},
        {"awaiting_rel": "1,2"},
        {"awaiting_rel": [1]},
        {"awaiting_rel": [[True, "", 0]]},
        {"awaiting_rel": [[1, "", -1]]},
        {"outbound": {}},
        {"outbound": [[1, "a", 2]]},
        {"outbound": [[1, "a", -1, 0]]},
        {"outbound": [[1, "a", 2, 3]]},
        {"outbound": [["1", "a", 2, 0]]},
        {"outbound": [[1, 5, 2, 0]]},
        {"outbound": [[1, "a", 2, 0, 0]]},
        {"outbound": [[1, "a", 2, 2, 1]]},  # a retained delivery is never COMPLETE
        {"outbound": [[1, "a", 2, 0, 1, 0]]},  # the queue item comes only for a queue other than 0
        {"outbound": [[1, "a", 2, 0, 2, 3]]},
        {"outbound": [[1, "a", 2, 0, 1, 2, 7]]},
    ],
)
def test_bad_qos2_fields_are_refused(extra: dict[str, Any]) -> None:
    data = json.dumps({"client_id": "c", "expiry_interval": 1} | extra).encode()
    with pytest.raises(ValueError, match=r"awaiting_rel|outbound"):
        SessionSnapshot.from_json(data)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_JSON)
def test_from_json_only_raises_what_load_skips(value: Any) -> None:
    candidates = [value]
    if isinstance(value, dict):
        candidates.append({"client_id": "c", **value})
        candidates.append({"client_id": "c", "outbound": value, "awaiting_rel": value})
    for candidate in candidates:
        try:
            SessionSnapshot.from_json(json.dumps(candidate).encode())
        except (ValueError, TypeError, KeyError):
            pass


async def test_store_skips_a_record_with_bad_qos2_state() -> None:
    backend = InMemoryBackend()
    store = SessionStateStore(backend)
    await store.load()
    await store.save(SessionSnapshot("a", 60, awaiting_rel=[InboundQos2(1)]))
    await backend.send(
        Message(SESSION_STATE_TOPIC, b'{"client_id":"a","expiry_interval":60,"outbound":[[1]]}', queue_id=0)
    )
    await backend.send(Message(SESSION_STATE_TOPIC, b"[]", queue_id=0))
    assert (await store.load())["a"].awaiting_rel == [InboundQos2(1)]


async def test_concurrent_writes_are_serialized_and_share_appends() -> None:
    backend = InMemoryBackend()
    store = SessionStateStore(backend)
    await store.load()
    state = {"n": 0}
    built: list[int] = []

    def build() -> SessionSnapshot:
        built.append(state["n"])
        return SessionSnapshot("c", 60, awaiting_rel=[InboundQos2(i) for i in range(1, state["n"] + 1)])

    async def change_and_write() -> None:
        state["n"] += 1
        await store.write("c", build)

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(change_and_write)
    assert len(built) < 10  # callers that arrived during a write shared the next one
    assert built[-1] == 10
    newest = (await store.load())["c"].awaiting_rel
    assert newest == [InboundQos2(i) for i in range(1, 11)]  # the last record is the newest
    assert store._writes == {}


# --- Session / Cursor -----------------------------------------------------------------------------
def test_cursor_restored_offsets_keep_commit_order() -> None:
    cursor = Cursor("%LMQ%a", 10)
    cursor.restored = {11: False, 12: True}  # 11 in flight under its old id, 12 done
    cursor.acknowledged(11)  # PUBCOMP for 11 before the reader got there
    assert cursor.committed == 10  # 10 (e.g. QoS 1) is still to come
    assert not cursor.reached(10)
    cursor.track(10)
    assert cursor.reached(11)
    assert cursor.reached(12)
    assert cursor.committed == 10
    cursor.complete(10)
    assert cursor.committed == 13
    assert cursor.restored == {}


async def _lmq_with(backend: InMemoryBackend, lmq: str, count: int) -> None:
    for i in range(count):
        await backend.send(
            Message(
                "t",
                b"m%d" % i,
                properties=encode_properties("t", 2, "p", False, NO_PROPERTIES),
                dispatch=(lmq,),
            )
        )


async def test_session_load_and_restore_inflight() -> None:
    backend = InMemoryBackend()
    lmq = "%LMQ%t"
    await _lmq_with(backend, lmq, 3)
    session = Session("dev", 60, send_quota=10)
    session.subscriptions["t"] = SubscriptionSpec("t", 2)
    session.cursors["t"] = cursor = Cursor(lmq, 1, session.group)
    snapshot = SessionSnapshot(
        "dev",
        60,
        awaiting_rel=[InboundQos2(4)],
        outbound=[
            OutboundQos2(7, "t", 0, SENT),  # below the committed offset: dropped
            OutboundQos2(8, "t", 1, SENT),
            OutboundQos2(9, "t", 2, RELEASED),
            OutboundQos2(0, "t", 3, COMPLETE),
            OutboundQos2(5, "gone/+", 1, SENT),  # subscription gone: dropped
            OutboundQos2(11, "t", 5, SENT),  # message no longer in the store
        ],
    )
    session.load_qos2(snapshot, 0)
    assert session.awaiting_rel == {4}
    assert cursor.restored == {1: False, 2: False, 3: True, 5: False}
    assert session.snapshot().outbound == [
        OutboundQos2(8, "t", 1, SENT),
        OutboundQos2(9, "t", 2, RELEASED),
        OutboundQos2(11, "t", 5, SENT),
        OutboundQos2(0, "t", 3, COMPLETE),
    ]

    def build(spec: SubscriptionSpec, message: StoredMessage, retained: bool) -> Publish:
        assert not retained
        return Publish("t", message.body, QoS(spec.qos), packet_id=1)

    await session.restore_inflight(backend, build)
    assert sorted(session.inflight) == [8, 9, 11]
    assert session.inflight[8].publish == Publish("t", b"m1", Q2, packet_id=8)
    assert not session.inflight[8].released
    assert session.inflight[9].released
    assert session.inflight[11].released
    assert all(e.durable for e in session.inflight.values())
    # New deliveries never reuse a restored id.
    assert session.add_inflight(lambda pid: Publish("t", b"", Q2, packet_id=pid), None, 0).packet_id == 1
    session._next_packet_id = 8
    assert session.add_inflight(lambda pid: Publish("t", b"", Q2, packet_id=pid), None, 0).packet_id == 10
    # Finishing 8 before the reader reaches offset 1 does not move the committed offset past it.
    session.finish(8)
    assert cursor.committed == 1
    assert cursor.restored[1] is True
    assert cursor.reached(1)
    assert cursor.committed == 2


async def test_durable_flag_only_for_persistent_qos2() -> None:
    make = lambda qos: lambda pid: Publish("t", b"", qos, packet_id=pid)  # noqa: E731
    persistent = Session("p", 60, send_quota=10)
    cursor = Cursor("%LMQ%t", 0)
    assert persistent.add_inflight(make(Q2), cursor, 0).durable
    assert not persistent.add_inflight(make(QoS.AT_LEAST_ONCE), cursor, 1).durable
    assert persistent.add_inflight(make(Q2), None, 77, retained_for="t").durable  # retained at SUBSCRIBE
    assert not persistent.add_inflight(make(Q2), None, 0).durable  # no cursor, not retained
    assert persistent.add_inflight(make(Q2), cursor, 2, shared=object()).durable
    assert not Session("c", 0, send_quota=10).add_inflight(make(Q2), cursor, 3).durable
    assert not Session("c", 0, send_quota=10).add_inflight(make(Q2), None, 5, retained_for="t").durable


async def test_completed_delivery_stays_recorded_until_committed() -> None:
    backend = InMemoryBackend()
    session = Session("dev", 60, send_quota=10)
    session.subscriptions["t"] = SubscriptionSpec("t", 2)
    session.cursors["t"] = cursor = Cursor("%LMQ%t", 0, session.group)
    make = lambda pid: Publish("t", b"", Q2, packet_id=pid)  # noqa: E731
    held_back = session.add_inflight(make, cursor, 0)  # e.g. waiting for its PUBCOMP
    done = session.add_inflight(make, cursor, 1)
    done.released = True
    assert session.snapshot().outbound == [
        OutboundQos2(held_back.packet_id, "t", 0, SENT),
        OutboundQos2(done.packet_id, "t", 1, RELEASED),
    ]
    session.finish(done.packet_id)
    assert session.snapshot().outbound == [
        OutboundQos2(held_back.packet_id, "t", 0, SENT),
        OutboundQos2(0, "t", 1, COMPLETE),  # offset 0 holds the committed offset back
    ]
    session.finish(held_back.packet_id)
    assert cursor.committed == 2
    assert sorted(session.snapshot().outbound, key=lambda r: r.offset) == [
        OutboundQos2(0, "t", 0, COMPLETE),
        OutboundQos2(0, "t", 1, COMPLETE),
    ]
    await session.commit_offsets(backend)  # stored committed offset passes both
    assert session.snapshot().outbound == []
    other = session.add_inflight(make, cursor, 2)
    session.finish(other.packet_id)
    del session.cursors["t"]  # unsubscribed: nothing of it is recorded any more
    assert session.snapshot().outbound == []
    assert session.settled == []


async def test_confirm_stored_looks_between_the_mark_and_the_restart() -> None:
    backend = InMemoryBackend()
    lmq = "%LMQ%in"

    async def store(body: bytes, client_id: str = "dev") -> None:
        props = encode_properties("in", 2, client_id, False, NO_PROPERTIES)
        await backend.send(Message("in", body, properties=props, dispatch=(lmq,)))

    await store(b"before the mark")
    await store(b"stored")
    await store(b"other client", client_id="x")

    def clock_ms() -> int:
        return time.time_ns() // 1_000_000

    stored_by = clock_ms()
    await wait_until(lambda: clock_ms() > stored_by)  # the restart is a later millisecond than every store
    restart_ms = clock_ms()
    await wait_until(lambda: clock_ms() > restart_ms)
    await store(b"after the restart")
    session = Session("dev", 60, send_quota=10)
    marks = [InboundQos2(1, lmq, 1), InboundQos2(2, lmq, 1), InboundQos2(3, lmq, 1), InboundQos2(4, lmq, 1)]
    session.load_qos2(SessionSnapshot("dev", 60, awaiting_rel=[*marks, InboundQos2(5)]), restart_ms)
    assert session.unconfirmed == {1, 2, 3, 4}
    assert await session.confirm_stored(backend, 1, "dev", "in", b"stored")
    assert await session.confirm_stored(backend, 2, "dev", "", b"stored")  # topic alias: no topic to compare
    assert not await session.confirm_stored(backend, 3, "dev", "in", b"before the mark")
    assert not await session.confirm_stored(backend, 4, "dev", "in", b"after the restart")
    assert not await session.confirm_stored(backend, 6, "dev", "in", b"other client")  # never awaited
    assert session.awaiting_rel == {1, 2, 5}
    assert session.unconfirmed == set()
    assert await session.confirm_stored(backend, 5, "dev", "in", b"anything")  # known to be stored
    assert session.release(1)
    assert not session.release(1)
    assert [e.packet_id for e in session.snapshot().awaiting_rel] == [2, 5]


async def test_shared_and_retained_deliveries_are_recorded_and_restored() -> None:
    backend = InMemoryBackend()
    lmq = "%LMQ%t"
    group = await SharedGroup.open(backend, "g", "t")  # commits its start: 0
    await _lmq_with(backend, lmq, 3)
    retained = await backend.send(
        Message("r", b"kept", properties=encode_properties("r", 2, "p", True, NO_PROPERTIES))
    )
    session = Session("dev", 60, send_quota=10)
    session.subscriptions["$share/g/t"] = SubscriptionSpec("$share/g/t", 2)
    session.shared["$share/g/t"] = group
    session.subscriptions["r"] = SubscriptionSpec("r", 2)
    make = lambda pid: Publish("t", b"", Q2, packet_id=pid)  # noqa: E731
    session.add_inflight(make, group.cursor, 0, shared=(group, None))
    session.add_inflight(make, None, retained.commitlog_offset, retained_for="r")
    assert session.snapshot().outbound == [
        OutboundQos2(1, "$share/g/t", 0, SENT),
        OutboundQos2(2, "r", retained.commitlog_offset, SENT, retained=True),
    ]

    # After a restart: a new group over the same store, a new session loaded from that snapshot.
    snapshot = session.snapshot()
    group = await SharedGroup.open(backend, "g", "t")
    session = Session("dev", 60, send_quota=10)
    session.subscriptions["$share/g/t"] = SubscriptionSpec("$share/g/t", 2)
    session.shared["$share/g/t"] = group
    session.subscriptions["r"] = SubscriptionSpec("r", 2)
    session.load_qos2(snapshot, 0)
    assert group.cursor.restored == {0: False}  # no other member delivers offset 0 again
    assert group.cursor.reached(0)  # another member's reader passes it first

    built: list[tuple[bytes, bool]] = []

    def build(spec: SubscriptionSpec, message: StoredMessage, is_retained: bool) -> Publish:
        built.append((message.body, is_retained))
        return Publish(spec.topic_filter, message.body, QoS(spec.qos), retain=is_retained, packet_id=9)

    await session.restore_inflight(backend, build)
    assert sorted(built) == [(b"kept", True), (b"m0", False)]
    assert session.inflight[1].cursor is group.cursor
    assert session.inflight[1].shared[0] is group
    assert session.inflight[2].retained_for == "r"
    assert session.inflight[2].publish.retain
    assert all(e.durable and not e.released for e in session.inflight.values())
    assert group.cursor.committed == 0
    session.finish(1)  # PUBCOMP from the member: the group moves past offset 0
    assert group.cursor.committed == 1
    session.finish(2)
    assert session.snapshot().outbound == [OutboundQos2(0, "$share/g/t", 0, COMPLETE)]


async def test_ending_session_hands_unreceived_shared_deliveries_back() -> None:
    backend = InMemoryBackend()
    lmq = "%LMQ%t"
    await backend.commit_consumer_offset("%MQTT_SHARE%g", lmq, 0, 0)
    await _lmq_with(backend, lmq, 4)
    group = await SharedGroup.open(backend, "g", "t")
    session = Session("dev", 60, send_quota=10)
    session.subscriptions["$share/g/t"] = SubscriptionSpec("$share/g/t", 2)
    session.shared["$share/g/t"] = group
    session.load_qos2(
        SessionSnapshot(
            "dev",
            60,
            outbound=[
                OutboundQos2(1, "$share/g/t", 0, SENT),  # the group will read past it first
                OutboundQos2(2, "$share/g/t", 1, SENT),  # the group has not reached it yet
                OutboundQos2(3, "$share/g/t", 2, RELEASED),  # the member has it: completes
            ],
        ),
        0,
    )
    message, cursor, offset = await group.claim(backend, 0.1)
    assert (message.body, cursor, offset) == (b"m0", group.cursor, 0)
    assert group.cursor.reached(0)  # what another member's reader does: skip it, wait for the owner
    await session.give_back_shared(backend)
    assert session.restored == []
    assert group.cursor.restored == {2: True}  # the reader completes it when it gets there
    claimed = [await group.claim(backend, 0.1) for _ in range(3)]
    assert [(m.body, o) for m, _, o in claimed] == [(b"m0", 0), (b"m1", 1), (b"m2", 2)]
    assert not group.cursor.reached(1)  # handed out as a fresh delivery
    group.cursor.complete(0)
    group.cursor.complete(1)
    assert group.cursor.reached(2)
    assert group.cursor.committed == 3  # offset 2 was completed by the give-back
