"""A queue of an LMQ whose broker was down when the subscription was made (cluster mode), without a
cluster: an in-memory store reads queue 1 of the LMQ from a topic of its own, as a second broker keeps its
own copy, and refuses it while that broker is "down". Once it answers, the lane starts at the first message
it stored since the subscription was made (the session record carries that time), on any node, even after
the session was offline meanwhile; nothing it stored before is delivered."""

from __future__ import annotations

import json

from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.mqtt import NO_PROPERTIES
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.types import Message, PullResult
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.gateway import Gateway, now_ms
from mqproxy.mqtt.mapping import encode_properties, lmq_name
from mqproxy.mqtt.session_record import SessionSnapshot, SubscriptionSpec
from mqproxy.mqtt.shared import SharedGroup

from ..conftest import wait_until  # type: ignore[import-not-found]

LMQ = lmq_name("jobs/+")
SECOND = "second_broker_copy"


class SecondBrokerDown(InMemoryBackend):
    """``LMQ`` is read on queues 0 and 1; queue 1 lives in topic ``SECOND`` and fails while ``down``."""

    down = True

    async def queue_ids(self, topic: str) -> tuple[int, ...]:
        return (0, 1) if topic == LMQ else (0,)

    def _at(self, topic: str, queue_id: int) -> tuple[str, int]:
        if topic != LMQ or queue_id != 1:
            return topic, queue_id
        if self.down:
            raise StoreUnavailable("broker-b does not answer")
        return SECOND, 0

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        return await super().pull(*self._at(topic, queue_id), offset, max_count)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await super().max_offset(*self._at(topic, queue_id))

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await super().search_offset(*self._at(topic, queue_id), timestamp_ms)

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        return await super().wait_for_message(*self._at(topic, queue_id), offset, timeout_s)

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        self._at(topic, queue_id)
        return await super().query_consumer_offset(group, topic, queue_id)

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._at(topic, queue_id)
        await super().commit_consumer_offset(group, topic, queue_id, offset)

    async def stored_on_second(self, body: bytes, client_id: str = "p") -> int:
        """Store a message of ``client_id`` on the second broker's copy of the LMQ; its store time."""
        props = encode_properties("jobs/1", 1, client_id, False, NO_PROPERTIES)
        result = await self.send(Message(SECOND, body, properties=props, queue_id=0))
        stored = (await self.pull(SECOND, 0, result.queue_offset, 1)).messages[0]
        return stored.store_timestamp_ms


async def _an_older_message(backend: SecondBrokerDown) -> None:
    """Queue 1 holds a message stored before anything the test subscribes (a millisecond earlier)."""
    stored_ms = await backend.stored_on_second(b"old")
    await wait_until(lambda: now_ms() > stored_ms)


async def test_a_resumed_session_reads_what_the_late_broker_stored_since_it_subscribed() -> None:
    backend = SecondBrokerDown()
    await _an_older_message(backend)
    backend.down = False
    before = await backend.max_offset(LMQ, 1)
    backend.down = True
    gateway = Gateway(backend, MqttConfig())
    await gateway.ready()
    session, _ = await gateway.open_session("dev", True, 3600, 10)
    await gateway.subscribe(session, SubscriptionSpec("jobs/+", 1))
    first, second = session.lanes_of("jobs/+")
    assert (first.positioned, second.positioned) == (True, False)
    assert session.subscriptions["jobs/+"].since_ms > 0
    assert second.since_ms == session.subscriptions["jobs/+"].since_ms
    await gateway.detached(session)  # offline before broker-b answers: lane 1 has no committed offset

    backend.down = False  # broker-b is back and stores messages for the offline session
    await backend.stored_on_second(b"new")

    other = Gateway(backend, MqttConfig())  # another node (or a restart) resumes from the record
    await other.ready()
    resumed = other.sessions["dev"]
    lanes = resumed.lanes_of("jobs/+")
    assert [c.next_offset for c in lanes] == [0, before], "lane 1 at 'new': not 'old', not the end"
    assert await backend.query_consumer_offset(resumed.group, LMQ, 1) == before, "committed at once"
    first_message = (await backend.pull(LMQ, 1, lanes[1].next_offset, 1)).messages[0]
    assert first_message.body == b"new"

    await gateway.position(second)  # the node that still holds the session positions it the same way
    assert second.next_offset == before


async def test_a_new_subscription_starts_at_the_end_and_a_replacement_keeps_its_time() -> None:
    backend = SecondBrokerDown()
    backend.down = False
    await _an_older_message(backend)
    gateway = Gateway(backend, MqttConfig())
    await gateway.ready()
    session, _ = await gateway.open_session("dev", True, 3600, 10)
    await gateway.subscribe(session, SubscriptionSpec("jobs/+", 1))
    assert [c.next_offset for c in session.lanes_of("jobs/+")] == [0, 1]
    since = session.subscriptions["jobs/+"].since_ms
    await wait_until(lambda: now_ms() > since)
    assert not await gateway.subscribe(session, SubscriptionSpec("jobs/+", 2))  # replaced: same start
    assert session.subscriptions["jobs/+"].since_ms == since
    assert session.subscriptions["jobs/+"].qos == 2


def test_since_ms_is_kept_in_the_record_and_old_records_load_without_it() -> None:
    spec = SubscriptionSpec("jobs/+", 1, since_ms=1234)
    assert spec == SubscriptionSpec("jobs/+", 1), "bookkeeping, not what the client asked for"
    raw = SessionSnapshot("dev", 60, [spec, SubscriptionSpec("a")]).to_json()
    subscriptions = json.loads(raw)["subscriptions"]
    assert [s.get("since_ms") for s in subscriptions] == [1234, None]
    loaded = SessionSnapshot.from_json(raw).subscriptions
    assert [s.since_ms for s in loaded] == [1234, 0]  # 0: no time known, a late lane starts at the end


async def test_an_old_record_without_a_time_starts_a_late_lane_at_the_end() -> None:
    backend = SecondBrokerDown()
    backend.down = False
    await _an_older_message(backend)
    await backend.stored_on_second(b"later")
    writer = Gateway(backend, MqttConfig())
    await writer.ready()
    await writer.write_record(SessionSnapshot("dev", 3600, [SubscriptionSpec("jobs/+", 1)]))
    gateway = Gateway(backend, MqttConfig())
    await gateway.ready()
    assert [c.next_offset for c in gateway.sessions["dev"].lanes_of("jobs/+")] == [0, 2]


async def test_a_shared_group_lane_reads_what_the_late_broker_stored_since_the_member_subscribed() -> None:
    backend = SecondBrokerDown()
    await _an_older_message(backend)
    group = await SharedGroup.open(backend, "g", "jobs/+", now_ms())
    assert [c.positioned for c in group.lanes] == [True, False]
    backend.down = False
    await backend.stored_on_second(b"new")
    message, cursor, offset = await group.claim(backend, 0.05)
    assert (message.body, cursor.queue_id, offset) == (b"new", 1, 1)
    assert await backend.query_consumer_offset(group.consumer_group, LMQ, 1) == 1


async def test_a_restored_member_opens_a_group_without_committed_offsets_at_its_time() -> None:
    """A node restarts (or another takes the session over) after broker-b came back: the group's lane on
    it has no committed offset and starts at what it stored since the member subscribed."""
    backend = SecondBrokerDown()
    backend.down = False
    await _an_older_message(backend)
    since = now_ms()
    await backend.stored_on_second(b"new")
    fresh = await SharedGroup.open(backend, "fresh", "jobs/+", since)
    assert [c.next_offset for c in fresh.lanes] == [0, 2], "a new subscription: the end"
    restored = await SharedGroup.open(backend, "g", "jobs/+", since, restored=True)
    assert [c.next_offset for c in restored.lanes] == [0, 1]
