"""PULL_MESSAGE on the embedded store: the answer's body is the store's records transcoded (not decoded
and encoded again), byte for byte the body the messages give."""

from __future__ import annotations

from pathlib import Path

from mqproxy.backends.embedded.broker import open_embedded_broker
from mqproxy.backends.embedded.embedded import open_embedded_store
from mqproxy.codecs.message_record import encode_records
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
