"""The message-trace buffer and dispatcher (:mod:`mqproxy.trace`): bounded, dropping and counting when
full, batched writes to the trace topic, and the tracing facade's records (:mod:`mqproxy.trace_facade`)."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest
import structlog
import trio

from mqproxy.backend_setup import service_settings
from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.memory import InMemoryBackend
from mqproxy.codecs.rocketmq_trace import (
    EndTransactionRecord,
    MessageType,
    PubRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceRecord,
    decode,
)
from mqproxy.facade.api import BrokerFacade, EndTransaction, PopRequest, PullRequest, SendOutcome, SendRequest
from mqproxy.facade.types import AckOutcome, Resolution
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.receipts import PoppedMessage, PopResult, Receipt
from mqproxy.model.types import Message, PullResult, PullStatus, SendResult, StoredMessage, TopicConfig
from mqproxy.settings import BrokerSettings
from mqproxy.trace import FLUSH_RECORDS, TraceBuffer, TraceDispatcher, record_fields
from mqproxy.trace_facade import TracingBroker
from tests.conftest import EventSink, wait_until


def sub_before(i: int) -> SubBeforeRecord:
    return SubBeforeRecord(timestamp_ms=i, group="G", request_id="R", msg_id=f"M{i}")


class FakeBroker:
    """What the dispatcher and the tracing facade call: sends are kept (or refused while ``broken``)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.topics: dict[str, int] = {}
        self.broken = False
        self.stored: list[StoredMessage] = []

    async def get_topic(self, topic: str) -> TopicConfig | None:
        n = self.topics.get(topic)
        return None if n is None else TopicConfig(topic, n, n)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        self.topics[topic] = queue_count or 4
        return TopicConfig(topic, self.topics[topic], self.topics[topic])

    async def send(self, request: SendRequest) -> SendOutcome:
        if self.broken:
            raise StoreUnavailable("disk full")
        self.sent.append(request.message)
        result = SendResult(request.message.topic, 0, len(self.sent) - 1, 1000 + len(self.sent), 1)
        half = request.message.properties.get("TRAN_MSG") == "true"
        return SendOutcome(result, request.message.topic, 0, parked="half" if half else "")

    async def end_transaction(self, end: EndTransaction) -> SendResult | None:
        return None

    async def pull(self, request: PullRequest) -> PullResult:
        found = tuple(m for m in self.stored if m.queue_offset >= request.offset)[: request.max_count]
        status = PullStatus.FOUND if found else PullStatus.NO_NEW_MSG
        return PullResult(status, found, request.offset + len(found), 0, len(self.stored))

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        return None

    async def pop(self, request: PopRequest) -> PopResult:
        items = tuple(
            PoppedMessage(m, Receipt(i, 1, 60_000, 0, 0, "broker-a", 0, m.queue_offset), request.topic)
            for i, m in enumerate(self.stored)
        )
        return PopResult(items, 1, 60_000, 0, 0)

    async def ack(self, group: str, topic: str, receipt: str) -> AckOutcome:
        return AckOutcome.ACKED

    async def change_invisible(self, group: str, topic: str, receipt: str, invisible_ms: int) -> str:
        return receipt.replace(" 60000 ", f" {invisible_ms} ")


def stored(offset: int, **props: str) -> StoredMessage:
    return StoredMessage(
        topic="T", queue_id=0, queue_offset=offset, commitlog_offset=100 + offset, store_size=0, body=b"x",
        flag=0, properties={"UNIQ_KEY": f"U{offset}", **props}, sys_flag=0, born_timestamp_ms=0,
        born_host=("127.0.0.1", 1), store_timestamp_ms=0, store_host=("127.0.0.1", 9876), reconsume_times=0,
        body_crc=0,
    )  # fmt: skip


def test_buffer_drops_and_counts_when_full_until_emptied() -> None:
    buffer = TraceBuffer(2)
    assert buffer.add(sub_before(1))
    assert buffer.add(sub_before(2))
    assert not buffer.add(sub_before(3))
    assert (len(buffer), buffer.dropped, buffer.dropping) == (2, 1, True)
    assert [r.timestamp_ms for r in buffer.take(1)] == [1]  # oldest first
    assert buffer.dropping  # not emptied yet
    buffer.take(10)
    assert (len(buffer), buffer.dropping) == (0, False)


class Recorder:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, result: str, n: int) -> None:
        self.counts[result] += n


async def test_dispatcher_creates_the_topic_and_flushes_in_batches(autojump_clock: Any) -> None:
    broker, counts = FakeBroker(), Recorder()
    dispatcher = TraceDispatcher(cast(BrokerFacade, broker), "TRACE_T", 10_000, counts)
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        assert broker.topics == {"TRACE_T": 1}
        for i in range(3):
            dispatcher.emit(sub_before(i))
        await wait_until(lambda: counts.counts["written"] == 3)
        assert len(broker.sent) == 1  # one trace message for records emitted together
        message = broker.sent[0]
        assert message.topic == "TRACE_T"
        assert message.properties["KEYS"] == "M0 M1 M2"
        assert [cast(SubBeforeRecord, r).msg_id for r in decode(message.body)] == ["M0", "M1", "M2"]
        start = trio.current_time()
        for i in range(FLUSH_RECORDS):  # a full batch is flushed before the interval ends
            dispatcher.emit(sub_before(i))
        await wait_until(lambda: counts.counts["written"] == 3 + FLUSH_RECORDS)
        assert trio.current_time() - start < 0.1
        assert all(m.body.count(b"\x02") <= 64 for m in broker.sent)  # records per message bounded
        nursery.cancel_scope.cancel()


async def test_dispatcher_drops_when_full_and_says_so_once(log_sink: EventSink) -> None:
    broker, counts = FakeBroker(), Recorder()
    dispatcher = TraceDispatcher(cast(BrokerFacade, broker), "TRACE_T", 5, counts)
    for i in range(8):
        dispatcher.emit(sub_before(i))  # no writer task running: the buffer fills
    assert counts.counts["dropped"] == 3
    dropping = log_sink.named("trace.dropping")
    assert len(dropping) == 1
    assert dropping[0]["capacity"] == 5
    assert dropping[0]["dropped_total"] == 1
    assert await dispatcher.flush() == 5
    dispatcher.emit(sub_before(9))  # the buffer emptied: a new episode logs again
    for i in range(5):
        dispatcher.emit(sub_before(i))
    assert len(log_sink.named("trace.dropping")) == 2


async def test_dispatcher_counts_failed_writes(log_sink: EventSink) -> None:
    broker, counts = FakeBroker(), Recorder()
    broker.broken = True
    dispatcher = TraceDispatcher(cast(BrokerFacade, broker), "TRACE_T", 100, counts)
    dispatcher.emit(sub_before(1))
    dispatcher.emit(sub_before(2))
    assert await dispatcher.flush() == 0
    assert counts.counts == {"failed": 2}
    failed = log_sink.named("trace.write_failed")
    assert failed[0]["topic"] == "TRACE_T"
    assert failed[0]["error"] == "StoreUnavailable"


def test_record_fields_per_type() -> None:
    pub = PubRecord(timestamp_ms=5, group="PG", topic="T", msg_id="M", keys="k1 k2", cost_ms=2,
                    success=False, tags="A", body_length=9)  # fmt: skip
    assert record_fields(pub) == {
        "trace_type": "Pub", "msg_id": "M", "group": "PG", "timestamp_ms": 5, "topic": "T", "cost_ms": 2,
        "success": False, "keys": "k1 k2",
    }  # fmt: skip
    before = SubBeforeRecord(timestamp_ms=6, group="CG", request_id="R", msg_id="M", retry_times=1)
    assert record_fields(before) == {
        "trace_type": "SubBefore", "msg_id": "M", "group": "CG", "timestamp_ms": 6, "request_id": "R",
        "retry_times": 1,
    }  # fmt: skip
    after = SubAfterRecord(request_id="R", msg_id="M", cost_ms=4, success=True, timestamp_ms=10, group="CG")
    assert record_fields(after) == {
        "trace_type": "SubAfter", "msg_id": "M", "group": "CG", "timestamp_ms": 10, "request_id": "R",
        "cost_ms": 4, "success": True,
    }  # fmt: skip
    end = EndTransactionRecord(timestamp_ms=7, group="PG", topic="T", msg_id="M", transaction_id="X",
                               state="COMMIT_MESSAGE", keys="k")  # fmt: skip
    assert record_fields(end) == {
        "trace_type": "EndTransaction", "msg_id": "M", "group": "PG", "timestamp_ms": 7, "topic": "T",
        "transaction_state": "COMMIT_MESSAGE", "keys": "k",
    }  # fmt: skip


async def test_every_emitted_record_is_logged_with_its_connection(log_sink: EventSink) -> None:
    dispatcher = TraceDispatcher(cast(BrokerFacade, FakeBroker()), "TRACE_T", 1, Recorder())
    with structlog.contextvars.bound_contextvars(conn_id="c1", protocol="grpc"):
        dispatcher.emit(sub_before(1))
        dispatcher.emit(sub_before(2))  # dropped from the full buffer, logged all the same
    dispatcher.emit(sub_before(3))  # emitted outside any connection
    events = log_sink.named("trace.record")  # validated against the log-event schema
    assert [(e["msg_id"], e.get("conn_id"), e.get("protocol")) for e in events] == [
        ("M1", "c1", "grpc"), ("M2", "c1", "grpc"), ("M3", None, None)
    ]  # fmt: skip


async def test_log_sampling_keeps_or_drops_a_message_whole(log_sink: EventSink) -> None:
    dispatcher = TraceDispatcher(
        cast(BrokerFacade, FakeBroker()), "T", 10_000, Recorder(), log_sample_rate=0.25
    )
    for i in range(400):
        dispatcher.emit(sub_before(i))
        dispatcher.emit(SubAfterRecord(request_id="R", msg_id=f"M{i}", cost_ms=1, success=True))
    logged = Counter(e["msg_id"] for e in log_sink.named("trace.record"))
    assert set(logged.values()) == {2}  # both records of a logged message
    assert 60 <= len(logged) <= 140  # about a quarter of the 400 messages
    assert len(dispatcher.buffer) == 800  # the trace topic still gets every record
    silent = TraceDispatcher(cast(BrokerFacade, FakeBroker()), "T", 10, Recorder(), log_sample_rate=0.0)
    log_sink.clear()
    silent.emit(sub_before(1))
    assert log_sink.named("trace.record") == []


class ListSink:
    enabled = True

    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def emit(self, record: TraceRecord) -> None:
        self.records.append(record)


def tracing() -> tuple[FakeBroker, ListSink, BrokerFacade]:
    inner, sink = FakeBroker(), ListSink()
    return (
        inner,
        sink,
        cast(BrokerFacade, TracingBroker(cast(BrokerFacade, inner), sink, "TR", ("127.0.0.1", 9876))),
    )


async def test_facade_traces_sends_but_not_trace_or_retry_topics() -> None:
    inner, sink, broker = tracing()
    props = {"UNIQ_KEY": "U1", "TAGS": "A", "KEYS": "k1", "MQTT_CLIENT_ID": "ignored-with-a-group"}
    await broker.send(SendRequest(Message("T", b"hello", properties=props), producer_group="PG"))
    await broker.send(SendRequest(Message("TR", b"x")))
    await broker.send(SendRequest(Message("%RETRY%G", b"x")))
    await broker.send(SendRequest(Message("T", b"mq", properties={"MQTT_CLIENT_ID": "dev1"})))
    first, mqtt = sink.records
    assert isinstance(first, PubRecord)
    assert isinstance(mqtt, PubRecord)
    assert (first.group, first.topic, first.msg_id, first.tags, first.keys, first.body_length) == (
        "PG",
        "T",
        "U1",
        "A",
        "k1",
        5,
    )
    assert first.success
    assert first.store_host == "127.0.0.1:9876"
    assert mqtt.group == "dev1"
    assert len(mqtt.msg_id) == 32  # sent without a UNIQ_KEY: given one (Java layout, IPv4)
    assert mqtt.msg_id.startswith("7F000001")  # the store host's IP first
    assert mqtt.offset_msg_id not in ("", mqtt.msg_id)
    inner.broken = True
    with pytest.raises(StoreUnavailable):
        await broker.send(SendRequest(Message("T", b"x", properties={"UNIQ_KEY": "U2"}), producer_group="PG"))
    failed = sink.records[-1]
    assert isinstance(failed, PubRecord)
    assert not failed.success
    assert failed.msg_id == "U2"


async def test_facade_traces_pulls_and_settles_them_on_commit() -> None:
    inner, sink, broker = tracing()
    inner.stored = [stored(0, KEYS="a"), stored(1)]
    await broker.pull(PullRequest("", "T", 0, 0, 32))  # the MQTT gateway's own read: no group, no trace
    assert sink.records == []
    await broker.pull(PullRequest("CG", "T", 0, 0, 32))
    await broker.pull(PullRequest("CG", "T", 0, 0, 32))  # pulled again: not a new delivery
    before = [r for r in sink.records if isinstance(r, SubBeforeRecord)]
    assert [(r.group, r.msg_id, r.keys) for r in before] == [("CG", "U0", "a"), ("CG", "U1", "")]
    assert before[0].request_id == before[1].request_id  # one batch, one request id
    await broker.commit_consumer_offset("CG", "T", 0, 1)
    after = [r for r in sink.records if isinstance(r, SubAfterRecord)]
    assert [(r.group, r.msg_id, r.success) for r in after] == [("CG", "U0", True)]
    await broker.pull(PullRequest("CG", "T", 0, 2, 32, commit_offset=2))
    after = [r for r in sink.records if isinstance(r, SubAfterRecord)]
    assert [r.msg_id for r in after] == ["U0", "U1"]


async def test_facade_traces_pops_and_acks() -> None:
    inner, sink, broker = tracing()
    inner.stored = [stored(0), stored(1)]
    popped = await broker.pop(PopRequest("CG", "T", 32, 60_000))
    handles = [p.receipt.encode() for p in popped.messages]
    assert [r.msg_id for r in sink.records if isinstance(r, SubBeforeRecord)] == ["U0", "U1"]
    await broker.ack("CG", "T", handles[0] + " extra")
    moved = await broker.change_invisible("CG", "T", handles[1], 5000)
    assert not [r for r in sink.records if isinstance(r, SubAfterRecord) and r.msg_id == "U1"]
    await broker.ack("CG", "T", moved)
    after = [r for r in sink.records if isinstance(r, SubAfterRecord)]
    assert [(r.msg_id, r.success, r.group) for r in after] == [("U0", True, "CG"), ("U1", True, "CG")]


async def test_facade_traces_the_end_of_a_half_message_it_stored() -> None:
    _, sink, broker = tracing()
    for uniq in ("H1", "H2"):
        props = {"UNIQ_KEY": uniq, "TRAN_MSG": "true", "TAGS": "t", "__transactionId__": f"tx-{uniq}"}
        await broker.send(SendRequest(Message("T", b"x", properties=props), producer_group="PG"))
    pubs = [r for r in sink.records if isinstance(r, PubRecord)]
    assert [r.msg_type for r in pubs] == [MessageType.TRANS_HALF] * 2
    # remoting names the half message by commit-log offset, gRPC by its id
    await broker.end_transaction(EndTransaction(Resolution.COMMIT, "PG", commitlog_offset=1001))
    await broker.end_transaction(EndTransaction(Resolution.ROLLBACK, transaction_id="H2", from_check=True))
    await broker.end_transaction(EndTransaction(Resolution.COMMIT, "PG", commitlog_offset=1001))  # repeated
    await broker.end_transaction(EndTransaction(Resolution.COMMIT, "PG", commitlog_offset=5))  # not ours
    ends = [r for r in sink.records if isinstance(r, EndTransactionRecord)]
    assert [(r.msg_id, r.transaction_id, r.state, r.from_check, r.group, r.tags) for r in ends] == [
        ("H1", "tx-H1", "COMMIT_MESSAGE", False, "PG", "t"),
        ("H2", "tx-H2", "ROLLBACK_MESSAGE", True, "PG", "t"),
    ]


async def test_end_transaction_on_the_embedded_broker() -> None:
    """The embedded facade parks a half message and ends it by the commit-log offset remoting names."""
    store = InMemoryBackend(default_queue_count=4, auto_create_topics=True)
    async with open_embedded_broker(store, service_settings(BrokerSettings())) as inner:
        sink = ListSink()
        broker = TracingBroker(inner, sink, "TR", ("127.0.0.1", 9876))
        props = {"UNIQ_KEY": "HALF1", "TRAN_MSG": "true", "PGROUP": "PG"}
        request = SendRequest(Message("T", b"x", properties=props), producer_group="PG", create_queues=1)
        sent = await broker.send(request)
        assert sent.parked == "half"
        await broker.end_transaction(
            EndTransaction(Resolution.COMMIT, "PG", commitlog_offset=sent.result.commitlog_offset)
        )
        ends = [r for r in sink.records if isinstance(r, EndTransactionRecord)]
        assert [(r.msg_id, r.state) for r in ends] == [("HALF1", "COMMIT_MESSAGE")]
