"""A producer's Telemetry stream announces the transaction producer groups of its topics to the facade (so a
cluster's check-backs may come to the node it is connected to), and the node's last stream of a topic
withdraws them."""

from __future__ import annotations

from typing import Any

import pytest

from mqproxy.codecs import rocketmq_v2 as pb

GrpcEnv = Any  # the grpc_env fixture (tests/grpc_service/conftest.py)


@pytest.fixture
def announced(grpc_env: GrpcEnv, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    calls: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        grpc_env.broker, "announce_producer", lambda group, present=True: calls.append((group, present))
    )
    return calls


def _settings(client_type: int, *topics: str) -> bytes:
    resources = [pb.Resource(name=t) for t in topics]
    if client_type == pb.ClientType.PRODUCER:
        settings = pb.Settings(client_type=client_type, publishing=pb.Publishing(topics=resources))
    else:
        settings = pb.Settings(
            client_type=client_type,
            subscription=pb.Subscription(
                group=pb.Resource(name="G"),
                subscriptions=[pb.SubscriptionEntry(topic=r) for r in resources],
            ),
        )
    return pb.TelemetryCommand(settings=settings).SerializeToString()


async def _open(grpc_env: GrpcEnv, client_id: str, payload: bytes) -> tuple[Any, int]:
    client = await grpc_env.connect(client_id)
    sid = await client.open("Telemetry", [payload], end=False)
    while not client.results[sid].messages():
        await client.changed.wait()
    return client, sid


async def test_producer_streams_announce_and_the_last_one_withdraws(
    grpc_env: GrpcEnv, announced: list[tuple[str, bool]]
) -> None:
    first, first_sid = await _open(grpc_env, "p1@1@0", _settings(pb.ClientType.PRODUCER, "TxA", "TxB"))
    assert sorted(announced) == [("%GRPC%TxA", True), ("%GRPC%TxB", True)]
    second, second_sid = await _open(grpc_env, "p2@1@0", _settings(pb.ClientType.PRODUCER, "TxA"))
    assert announced[-1] == ("%GRPC%TxA", True)  # idempotent in the facade; announced again is harmless
    announced.clear()

    await first.end(first_sid)  # the client half-closes: the stream completes
    await first.wait(first_sid)
    assert announced == [("%GRPC%TxB", False)]  # TxA still has the second producer here
    await second.end(second_sid)
    await second.wait(second_sid)
    assert announced == [("%GRPC%TxB", False), ("%GRPC%TxA", False)]


async def test_consumers_announce_nothing(grpc_env: GrpcEnv, announced: list[tuple[str, bool]]) -> None:
    client, sid = await _open(grpc_env, "c1@1@0", _settings(pb.ClientType.SIMPLE_CONSUMER, "TxA"))
    await client.end(sid)
    await client.wait(sid)
    assert announced == []
