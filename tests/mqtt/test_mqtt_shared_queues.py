"""A shared group over an LMQ with two queues (two brokers of a cluster), without a cluster: an in-memory
store keeps queue 1 of each LMQ as a plain topic of its own, as a second broker keeps its own copy. What
the second broker stored (during a failover of the first) reaches the group too, its offsets are committed
per queue, and a restored QoS 2 delivery is marked on the cursor of its queue."""

from __future__ import annotations

import trio

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.mqtt import NO_PROPERTIES
from mqproxy.model.types import Message, PullResult
from mqproxy.mqtt.mapping import encode_properties, lmq_name
from mqproxy.mqtt.session import Session
from mqproxy.mqtt.session_record import SENT, OutboundQos2, SessionSnapshot, SubscriptionSpec
from mqproxy.mqtt.shared import Claimed, SharedGroup

from ..conftest import wait_until  # type: ignore[import-not-found]

LMQ = lmq_name("jobs/+")


class TwoBrokers(InMemoryBackend):
    """Every LMQ read on queues 0 and 1; queue 1 lives in topic ``second_<n>`` (queue 0)."""

    names: dict[str, str]

    async def queue_ids(self, topic: str) -> tuple[int, ...]:
        return (0, 1)

    def _at(self, topic: str, queue_id: int) -> tuple[str, int]:
        if queue_id != 1:
            return topic, queue_id
        names = self.__dict__.setdefault("names", {})
        return names.setdefault(topic, f"second_{len(names)}"), 0

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        return await super().pull(*self._at(topic, queue_id), offset, max_count)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await super().max_offset(*self._at(topic, queue_id))

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        return await super().wait_for_message(*self._at(topic, queue_id), offset, timeout_s)

    async def second_broker_up(self) -> None:
        """The second broker's copy of the LMQ exists (empty): it answers."""
        await self.create_topic(self._at(LMQ, 1)[0], 1)

    async def stored_on_second(self, body: bytes) -> None:
        topic, _ = self._at(LMQ, 1)
        props = encode_properties("jobs/1", 1, "p", False, NO_PROPERTIES)
        await self.send(Message(topic, body, properties=props, queue_id=0))


async def _stored_on_first(backend: InMemoryBackend, body: bytes) -> None:
    props = encode_properties("jobs/1", 1, "p", False, NO_PROPERTIES)
    await backend.send(Message("jobs", body, properties=props, dispatch=(LMQ,)))


async def test_a_group_reads_every_queue_and_commits_each() -> None:
    backend = TwoBrokers()
    await backend.stored_on_second(b"before")  # before the group existed: not for it
    group = await SharedGroup.open(backend, "g", "jobs/+")
    assert [(c.queue_id, c.next_offset) for c in group.lanes] == [(0, 0), (1, 1)]
    await _stored_on_first(backend, b"one")
    await backend.stored_on_second(b"two")  # the first broker failed over meanwhile
    one, two = [await group.claim(backend, 0.1) for _ in range(2)]  # the queues in turn
    assert [(m.body, c.queue_id, o) for m, c, o in (one, two)] == [(b"one", 0, 0), (b"two", 1, 1)]
    assert two[1] is group.lane(1)
    group.give_back(*two)  # its member left before acknowledging it
    assert await group.claim(backend, 0.1) == two
    for _, cursor, offset in (one, two):
        cursor.complete(offset)
    assert not group.pending
    await group.commit(backend)
    assert await backend.query_consumer_offset("%MQTT_SHARE%g", LMQ, 0) == 1
    assert await backend.query_consumer_offset("%MQTT_SHARE%g", LMQ, 1) == 2

    reopened = await SharedGroup.open(backend, "g", "jobs/+")  # e.g. on another node: resumes per queue
    assert [c.next_offset for c in reopened.lanes] == [1, 2]


async def test_a_restored_qos2_delivery_is_marked_on_the_cursor_of_its_queue() -> None:
    backend = TwoBrokers()
    await backend.second_broker_up()
    group = await SharedGroup.open(backend, "g", "jobs/+")
    await backend.stored_on_second(b"two")
    session = Session("dev", 60, send_quota=10)
    session.subscriptions["$share/g/jobs/+"] = SubscriptionSpec("$share/g/jobs/+", 2)
    session.shared["$share/g/jobs/+"] = group
    record = OutboundQos2(7, "$share/g/jobs/+", 0, SENT, False, 1)
    session.load_qos2(SessionSnapshot("dev", 60, outbound=[record]), 0)
    assert group.lanes[1].restored == {0: False}
    assert group.lanes[0].restored == {}
    assert session.snapshot().outbound == [record], "the record keeps its queue"
    await session.give_back_shared(backend)  # never re-sent: back to the group, from queue 1
    message, cursor, offset = await group.claim(backend, 0.1)
    assert (message.body, cursor.queue_id, offset) == (b"two", 1, 0)


async def test_a_queue_whose_broker_was_down_at_open_is_read_once_it_answers() -> None:
    """Positioned at its end by the first look after its broker answers (a broker that is down stored
    nothing meanwhile), then read like the others."""
    backend = TwoBrokers()  # queue 1's broker does not answer yet
    group = await SharedGroup.open(backend, "g", "jobs/+")
    assert [c.positioned for c in group.lanes] == [True, False]
    await backend.second_broker_up()
    claimed: list[Claimed] = []

    async def member() -> None:
        claimed.append(await group.claim(backend, 0.05))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(member)
        await wait_until(lambda: group.lanes[1].positioned)
        await backend.stored_on_second(b"two")
    assert [(m.body, c.queue_id, o) for m, c, o in claimed] == [(b"two", 1, 0)]
