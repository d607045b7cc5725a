"""The inbound QoS 2 duplicate check on an LMQ with a queue per broker (cluster mode), without a cluster:
the in-memory two-broker store of :mod:`.test_mqtt_late_lanes`. The mark of an id awaiting PUBREL names
the size of every queue whose broker answered, so a re-sent PUBLISH whose first copy a crash left on the
second broker is found there (not stored again); marks of earlier versions name queue 0 and still load."""

from __future__ import annotations

import json

import pytest

from mqproxy.codecs.mqtt import NO_PROPERTIES
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.delivery import Deliveries
from mqproxy.mqtt.gateway import Gateway, now_ms
from mqproxy.mqtt.mapping import encode_properties
from mqproxy.mqtt.session import Session
from mqproxy.mqtt.session_record import InboundQos2, SessionSnapshot

from ..conftest import wait_until  # type: ignore[import-not-found]
from .test_mqtt_late_lanes import LMQ, SecondBrokerDown  # type: ignore[import-not-found]


def test_a_mark_of_queue_0_alone_keeps_the_old_wire_form() -> None:
    legacy = InboundQos2.mark(3, LMQ, [(0, 40)])
    assert legacy == InboundQos2(3, LMQ, 40)
    assert legacy.queues == ((0, 40),)
    both = InboundQos2.mark(4, LMQ, [(0, 40), (1, 7)])
    only_second = InboundQos2.mark(5, LMQ, [(1, 7)])  # queue 0's broker did not answer
    assert only_second.queues == ((1, 7),)
    assert only_second.offset == 0
    raw = SessionSnapshot("dev", 60, awaiting_rel=[InboundQos2(2), legacy, both, only_second]).to_json()
    assert json.loads(raw)["awaiting_rel"] == [
        [2, "", 0],
        [3, LMQ, 40],
        [4, LMQ, 40, [[0, 40], [1, 7]]],
        [5, LMQ, 0, [[1, 7]]],
    ]
    assert SessionSnapshot.from_json(raw).awaiting_rel == [InboundQos2(2), legacy, both, only_second]


@pytest.mark.parametrize("sizes", [[], [[1]], [[1, -1]], [[0, 1, 2]], "x", [["0", 1]]])
def test_bad_queue_sizes_are_refused(sizes: object) -> None:
    with pytest.raises(ValueError, match="queue sizes"):
        InboundQos2.from_list([1, LMQ, 0, sizes])


async def _stored_on(backend: SecondBrokerDown, queue_id: int, body: bytes) -> None:
    """A PUBLISH of client ``dev`` to ``jobs/1`` stored on the broker of ``queue_id``."""
    if queue_id == 1:
        await backend.stored_on_second(body, client_id="dev")
        return
    props = encode_properties("jobs/1", 2, "dev", False, NO_PROPERTIES)
    await backend.send(Message("jobs", body, properties=props, dispatch=(LMQ,)))


async def _restarted_session(marks: list[InboundQos2]) -> Session:
    """A session restored after a crash a millisecond after everything stored so far."""
    stored_by = now_ms()
    await wait_until(lambda: now_ms() > stored_by)
    session = Session("dev", 60, send_quota=10)
    session.load_qos2(SessionSnapshot("dev", 60, awaiting_rel=marks), now_ms())
    return session


async def test_a_resent_publish_stored_on_the_second_broker_is_a_duplicate() -> None:
    backend = SecondBrokerDown()
    backend.down = False
    await _stored_on(backend, 0, b"earlier")
    await _stored_on(backend, 1, b"earlier")
    marks = [InboundQos2.mark(i, LMQ, [(0, 1), (1, 1)]) for i in (1, 2)] + [InboundQos2(3, LMQ, 1)]
    await _stored_on(backend, 1, b"stored on b")  # queue 0's broker failed: the send went to the other
    session = await _restarted_session(marks)
    assert await session.confirm_stored(backend, 1, "dev", "jobs/1", b"stored on b")
    assert not await session.confirm_stored(backend, 2, "dev", "jobs/1", b"earlier"), "before the mark"
    assert not await session.confirm_stored(backend, 3, "dev", "jobs/1", b"stored on b"), "an old mark"
    assert session.awaiting_rel == {1}


async def test_a_queue_whose_broker_is_down_is_passed_over() -> None:
    backend = SecondBrokerDown()
    backend.down = False
    await _stored_on(backend, 0, b"stored on a")
    marks = [InboundQos2.mark(i, LMQ, [(0, 0), (1, 0)]) for i in (1, 2)]
    session = await _restarted_session([*marks, InboundQos2.mark(3, LMQ, [(1, 0)])])
    backend.down = True
    assert await session.confirm_stored(backend, 1, "dev", "jobs/1", b"stored on a")
    assert not await session.confirm_stored(backend, 2, "dev", "jobs/1", b"elsewhere")  # stored again
    with pytest.raises(StoreUnavailable):  # one queue only: nothing to decide with
        await session.confirm_stored(backend, 3, "dev", "jobs/1", b"stored on a")


async def test_the_mark_names_every_queue_of_the_lmq() -> None:
    backend = SecondBrokerDown()
    backend.down = False
    await _stored_on(backend, 0, b"one")
    await _stored_on(backend, 1, b"two")
    await _stored_on(backend, 1, b"three")
    deliveries = type("Bare", (Deliveries,), {})()  # only its gateway is used (a subclass has a __dict__)
    deliveries.gateway = Gateway(backend, MqttConfig())
    assert await deliveries._queue_sizes(LMQ) == [(0, 1), (1, 2)]
    backend.down = True
    with pytest.raises(StoreUnavailable):  # the embedded store has one queue: its failure is the store's
        await deliveries._queue_sizes(LMQ)
