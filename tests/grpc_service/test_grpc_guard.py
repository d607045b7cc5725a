"""The ACL account file on gRPC calls, through the driver with a real h2 client in memory: UNAUTHORIZED /
FORBIDDEN in the response status, Telemetry's grpc-status, the per-address back-off and the denial
reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from mqproxy.acl.rules import parse_acl
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_auth import authorization_value
from mqproxy.codecs.grpc_framing import GrpcStatus
from mqproxy.settings import Settings

from ..proxy.conftest import running_server  # type: ignore[import-not-found]
from .test_grpc_rpcs import message, receive

GrpcEnv = Any
Code = pb.Code
DATE = "20261128T091500Z"
ACL = """
accounts:
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: ["Orders=PUB|SUB", "Feed=SUB"]
    groupPerms: ["Blocked=DENY"]
"""


@dataclass
class Reports:
    """The ``auth.denied`` events and the ``mqproxy_auth_denied_total`` series of the test's server."""

    log_sink: Any
    server: Any

    @property
    def seen(self) -> list[dict[str, Any]]:
        return self.log_sink.named("auth.denied")

    @property
    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.seen]

    def counted(self, reason: str) -> float:
        return float(self.server.metrics.auth_denied.labels("grpc", reason)._value.get())


@pytest.fixture
def reports(grpc_env: GrpcEnv, log_sink: Any) -> Reports:
    grpc_env.server.acl.replace(parse_acl(ACL, "plain_acl.yml"))
    grpc_env.server.acl.clock = trio.current_time
    return Reports(log_sink, grpc_env.server)


def signed(ak: str = "app", sk: str = "app-secret") -> dict[str, str]:
    return {"authorization": authorization_value(ak, sk, DATE), "x_mq_date_time": DATE}


def route(topic: str) -> Any:
    return pb.QueryRouteRequest(topic=pb.Resource(name=topic))


async def test_without_rules_every_call_passes(grpc_env: GrpcEnv) -> None:
    client = await grpc_env.connect()
    answer = await client.unary("QueryRoute", route("Anything"))
    assert answer.status.code == Code.OK


async def test_right_keys_pass_and_wrong_keys_are_unauthorized(grpc_env: GrpcEnv, reports: Reports) -> None:
    client = await grpc_env.connect()
    assert (await client.unary("QueryRoute", route("Orders"), **signed())).status.code == Code.OK
    go_style = {
        "authorization": authorization_value("app", "app-secret", DATE, upper=False,
                                             credential_suffix="//Rocketmq"),
        "x_mq_date_time": DATE,
    }
    assert (await client.unary("QueryRoute", route("Feed"), **go_style)).status.code == Code.OK
    anonymous = await client.unary("QueryRoute", route("Orders"))
    wrong = await client.unary("QueryRoute", route("Orders"), **signed(sk="guess"))
    unknown = await client.unary("QueryRoute", route("Orders"), **signed(ak="who"))
    for answer in (anonymous, wrong, unknown):
        assert answer.status.code == Code.UNAUTHORIZED
        assert "app-secret" not in answer.status.message
    assert reports.reasons == ["no_access_key", "bad_signature", "unknown_access_key"]
    event = reports.seen[1]
    assert (event["access_key"], event["protocol"]) == ("app", "grpc")
    assert event["peer"].startswith("127.0.0.1:")
    assert event["detail"].startswith("QueryRoute: Check signature failed")
    assert all("app-secret" not in line.decode() for line in reports.log_sink.lines)
    assert reports.counted("bad_signature") == 1


async def test_forbidden_topic_and_group(grpc_env: GrpcEnv, reports: Reports) -> None:
    client = await grpc_env.connect()
    sent = await client.unary("SendMessage", pb.SendMessageRequest(messages=[message("Orders")]), **signed())
    assert sent.status.code == Code.OK
    refused = await client.unary("SendMessage", pb.SendMessageRequest(messages=[message("Feed")]), **signed())
    assert refused.status.code == Code.FORBIDDEN
    assert "Feed" in refused.status.message
    assert (await client.unary("QueryRoute", route("Secret"), **signed())).status.code == Code.FORBIDDEN
    assert reports.reasons == ["no_permission", "no_permission"]
    assert reports.counted("no_permission") == 2
    # nothing of the refused send was stored
    assert await grpc_env.broker.get_topic("Feed") is None


async def test_receive_needs_sub_on_group_and_topic(grpc_env: GrpcEnv, reports: Reports) -> None:
    client = await grpc_env.connect()
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name="Blocked"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="Orders")),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=1,
        invisible_duration=pb.Duration(seconds=30),
    )
    sid = await client.open("ReceiveMessage", [request.SerializeToString()], grpc_timeout="5S", **signed())
    result = await client.wait(sid)
    assert result.grpc_status == 0
    (only,) = [pb.ReceiveMessageResponse.FromString(m) for m in result.messages()]
    assert only.status.code == Code.FORBIDDEN
    assert "Blocked" in only.status.message
    status, _ = await receive(client, "Orders", "G1")  # unsigned: refused before the handler
    assert status.code == Code.UNAUTHORIZED


def settings(*, publish: str | None = None, group: str | None = None, topic: str | None = None) -> bytes:
    if publish is not None:
        s = pb.Settings(client_type=pb.ClientType.PRODUCER,
                        publishing=pb.Publishing(topics=[pb.Resource(name=publish)]))
    else:
        entry = pb.SubscriptionEntry(topic=pb.Resource(name=topic))
        s = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER, subscription=pb.Subscription(
            group=pb.Resource(name=group), subscriptions=[entry]))
    return bytes(pb.TelemetryCommand(settings=s).SerializeToString())


async def test_telemetry_is_authenticated_and_its_settings_checked(
    grpc_env: GrpcEnv, reports: Reports
) -> None:
    client = await grpc_env.connect()
    anonymous = await client.wait(await client.open("Telemetry", [settings(publish="Orders")]))
    assert anonymous.grpc_status == GrpcStatus.UNAUTHENTICATED
    forbidden = await client.wait(
        await client.open("Telemetry", [settings(publish="Feed")], end=False, **signed())
    )
    assert forbidden.grpc_status == GrpcStatus.PERMISSION_DENIED
    assert "Feed" in forbidden.grpc_message
    sid = await client.open("Telemetry", [settings(group="G1", topic="Feed")], end=False, **signed())
    while not client.results[sid].messages():
        await client.changed.wait()
    reply = pb.TelemetryCommand.FromString(client.results[sid].messages()[0])
    assert reply.status.code == Code.OK
    await client.end(sid)
    assert (await client.wait(sid)).grpc_status == 0
    assert reports.reasons == ["no_access_key", "no_permission"]


async def test_failed_authentication_is_throttled_per_address(
    grpc_env: GrpcEnv, reports: Reports, autojump_clock: trio.testing.MockClock
) -> None:
    client = await grpc_env.connect()
    throttle = grpc_env.server.acl.throttle
    for _ in range(throttle.free_failures + 1):
        assert (await client.unary("QueryRoute", route("Orders"))).status.code == Code.UNAUTHORIZED
    # backing off: even the right keys are refused unseen, counted but not logged
    refused = await client.unary("QueryRoute", route("Orders"), **signed())
    assert refused.status.code == Code.UNAUTHORIZED
    assert refused.status.message.startswith("too many failed authentications from 127.0.0.1; retry in")
    assert reports.counted("throttled") == 1
    assert "throttled" not in reports.reasons
    assert reports.reasons == ["no_access_key"] * (throttle.free_failures + 1)
    await trio.sleep(throttle.delay_for("127.0.0.1", trio.current_time()))
    assert (await client.unary("QueryRoute", route("Orders"), **signed())).status.code == Code.OK
    assert throttle.delay_for("127.0.0.1", trio.current_time()) == 0  # a success forgets the address


async def test_the_server_applies_its_acl_file(
    tmp_path: Any, grpc_client_cls: Any, nursery: trio.Nursery, log_sink: Any
) -> None:
    """The real server over loopback: ``[acl] file`` reaches every gRPC connection."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL, encoding="utf-8")
    async with running_server(Settings.for_tests(acl={"file": str(path)})) as handle:
        client = grpc_client_cls(await trio.open_tcp_stream(*handle.address), "loop@1@0")
        await client.start(nursery)
        assert (await client.unary("QueryRoute", route("Orders"), **signed())).status.code == Code.OK
        assert (await client.unary("QueryRoute", route("Orders"))).status.code == Code.UNAUTHORIZED
        assert (await client.unary("QueryRoute", route("Other"), **signed())).status.code == Code.FORBIDDEN
        metrics = handle.state.metrics.auth_denied
        assert metrics.labels("grpc", "no_access_key")._value.get() == 1
        assert metrics.labels("grpc", "no_permission")._value.get() == 1
    assert [e["reason"] for e in log_sink.named("auth.denied")] == ["no_access_key", "no_permission"]


async def test_telemetry_settings_follow_a_reload(grpc_env: GrpcEnv, reports: Reports) -> None:
    client = await grpc_env.connect()
    sid = await client.open("Telemetry", [settings(group="G1", topic="Feed")], end=False, **signed())
    while not client.results[sid].messages():
        await client.changed.wait()
    grpc_env.server.acl.replace(parse_acl(ACL.replace('"Feed=SUB"', '"Feed=PUB"'), "plain_acl.yml"))
    await client.send_message(sid, settings(group="G1", topic="Feed"))
    assert (await client.wait(sid)).grpc_status == GrpcStatus.PERMISSION_DENIED
    grpc_env.server.acl.replace(parse_acl(ACL, "plain_acl.yml"))
    other = await client.open("Telemetry", [settings(group="G1", topic="Orders")], end=False, **signed())
    while not client.results[other].messages():
        await client.changed.wait()
    grpc_env.server.acl.replace(parse_acl("accounts: []", "plain_acl.yml"))  # the account is gone
    await client.send_message(other, settings(group="G1", topic="Orders"))
    assert (await client.wait(other)).grpc_status == GrpcStatus.UNAUTHENTICATED
    assert reports.reasons == ["no_permission", "unknown_access_key"]
