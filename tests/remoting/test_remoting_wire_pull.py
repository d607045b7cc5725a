"""PULL_MESSAGE on the embedded store: the answer's body is the store's records transcoded (not decoded
and encoded again), byte for byte the body the messages give."""

from __future__ import annotations

from pathlib import Path

import structlog.testing

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.codecs.message_record import decode_records, encode_records
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.model.types import Message
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.remoting.session import RemotingSession

from .conftest import ADVERTISED  # type: ignore[import-not-found]


async def test_a_pull_answers_the_transcoded_records(wire, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    async with open_embedded_store(tmp_path / "s", store_host=ADVERTISED) as store:
        await store.create_topic("T", 1)
        for n in range(40):
            props = {"UNIQ_KEY": f"ID{n}", "TAGS": "A", "WAIT": "true"}
            await store.send(
                Message("T", b"m%d" % n, queue_id=0, properties=props, born_host=("10.0.0.9", 5))
            )
        async with open_embedded_broker(store) as broker:
            session = RemotingSession(broker, ServerContext(*ADVERTISED, groups=ConnectionRegistry()))
            ext = {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "4", "maxMsgNums": "32",
                   "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
                   "subscription": "*"}  # fmt: skip
            response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
            expected = encode_records(
                (await store.pull("T", 0, 4, 32)).messages, legacy=session.legacy_records
            )
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["nextBeginOffset"] == "36"
    assert response.body == expected


async def test_a_pull_carries_a_message_whose_properties_outgrew_a_record(wire, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # an MQTT topic of ~32.7 KB passes the store's check; the LMQ properties the store adds take the stored
    # properties past a record's 32,767 bytes: the transcoding path leaves the pull to the general one, which
    # cuts the properties down and logs it, and the answer's other messages go out as before
    props = {"MQTT_TOPIC": "t/" + "x" * 32_680, "UNIQ_KEY": "ID1", "TAGS": "A"}
    async with open_embedded_store(tmp_path / "s", store_host=ADVERTISED) as store:
        await store.create_topic("T", 1)
        for n in range(3):
            message = Message("T", b"m%d" % n, queue_id=0, properties={"UNIQ_KEY": f"ID{n}", "TAGS": "A"})
            if n == 1:
                message = Message("T", b"long", queue_id=0, properties=props, dispatch=("%LMQ%t%2Fx",))
            await store.send(message)
        async with open_embedded_broker(store) as broker:
            session = RemotingSession(broker, ServerContext(*ADVERTISED, groups=ConnectionRegistry()))
            ext = {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
                   "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
                   "subscription": "*"}  # fmt: skip
            with structlog.testing.capture_logs() as logs:
                response = await session.handle(wire(RequestCode.PULL_MESSAGE, ext))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    records = decode_records(response.body)
    assert [(r.body, r.properties["UNIQ_KEY"], r.properties["TAGS"]) for r in records] == [
        (b"m0", "ID0", "A"), (b"long", "ID1", "A"), (b"m2", "ID2", "A")
    ]  # fmt: skip
    assert "MQTT_TOPIC" not in records[1].properties
    (event,) = [e for e in logs if e["event"] == "remoting.properties_dropped"]
    assert (event["op"], event["topic"], event["offset"], event["dropped_properties"]) == (
        "PULL_MESSAGE", "T", 1, ["MQTT_TOPIC"]
    )  # fmt: skip
