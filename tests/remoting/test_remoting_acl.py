"""ACL 1.0 on remoting: the sans-IO decision (mqproxy.remoting.auth) and RemotingSession's refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
import structlog.testing
import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.acl.rules import AclRules, parse_acl
from mqproxy.acl.throttle import AuthThrottle
from mqproxy.backends.embedded.broker import EmbeddedBroker
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_acl import sign
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.remoting.auth import authorize, resources
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.session import RemotingSession

ACL_YAML = """\
globalWhiteRemoteAddresses:
  - 10.9.*
accounts:
  - accessKey: producer
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [orders=PUB, "both=PUB|SUB"]
  - accessKey: consumer
    secretKey: consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: DENY
    topicPerms: [secret=DENY]
    groupPerms: [G=SUB]
  - accessKey: trusted
    secretKey: trusted-secret
    whiteRemoteAddress: 192.0.2.*
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: admin
    secretKey: admin-secret
    admin: true
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
SECRETS = {"producer": "producer-secret", "consumer": "consumer-secret", "admin": "admin-secret",
           "trusted": "trusted-secret"}  # fmt: skip
RULES = parse_acl(ACL_YAML, "plain_acl.yml")
PEER = ("198.51.100.7", 40000)


def signed(code: int, ext: dict[str, str], body: bytes = b"", *, ak: str | None = "producer",
           secret: str | None = None, token: str | None = None) -> RemotingCommand:  # fmt: skip
    """A request signed as AclClientRPCHook signs it (``secret`` overrides the account's)."""
    fields = dict(ext)
    if ak is not None:
        sign(fields, body, ak, secret if secret is not None else SECRETS[ak], token)
    return RemotingCommand(code, opaque=3, ext_fields=fields, body=body)


def send_v2(topic: str, **kw: Any) -> RemotingCommand:
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000001",
           "h": "0", "i": "TAGS\x01A\x02"}  # fmt: skip
    return signed(RequestCode.SEND_MESSAGE_V2, ext, b"hello", **kw)


def pull(topic: str, group: str = "G", **kw: Any) -> RemotingCommand:
    ext = {"consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
           "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*"}  # fmt: skip
    return signed(RequestCode.PULL_MESSAGE, ext, **kw)


def heartbeat(group: str, topics: list[str], **kw: Any) -> RemotingCommand:
    body = json.dumps({"clientID": "c1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}]}).encode()  # fmt: skip
    return signed(RequestCode.HEART_BEAT, {}, body, **kw)


# --- the decision ---------------------------------------------------------------------------------------


def test_order_global_white_first() -> None:
    unsigned = RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={"topic": "x"})
    assert authorize(RULES, unsigned, "10.9.3.4").allowed
    verdict = authorize(RULES, unsigned, PEER[0])
    assert (verdict.allowed, verdict.reason, verdict.detail) == (
        False,
        "no_access_key",
        "No accessKey is configured",
    )


def test_unknown_key_and_bad_signature() -> None:
    verdict = authorize(RULES, send_v2("orders", ak="producer", secret="guess"), PEER[0])
    assert (verdict.reason, verdict.detail) == (
        "bad_signature",
        "Check signature failed for accessKey=producer",
    )
    stranger = send_v2("orders", ak="producer")
    stranger.ext_fields["AccessKey"] = "nobody"
    assert authorize(RULES, stranger, PEER[0]).detail == "No acl config for nobody"
    tampered = send_v2("orders")
    tampered.body = b"changed"
    assert authorize(RULES, tampered, PEER[0]).reason == "bad_signature"


def test_security_token_is_signed_and_accepted() -> None:
    verdict = authorize(RULES, send_v2("orders", token="sts-token"), PEER[0])
    assert verdict.allowed
    assert verdict.authenticated


def test_go_client_signature_without_the_security_token_is_accepted() -> None:
    go = send_v2("orders")  # rocketmq-client-go signs first, then adds the token
    go.ext_fields["SecurityToken"] = "sts-token"
    assert authorize(RULES, go, PEER[0]).allowed
    forged = send_v2("orders", secret="guess")
    forged.ext_fields["SecurityToken"] = "sts-token"
    assert authorize(RULES, forged, PEER[0]).reason == "bad_signature"


def test_account_white_address_skips_signature_and_permission_checks() -> None:
    request = send_v2("orders", ak="trusted", secret="wrong")
    verdict = authorize(RULES, request, "192.0.2.9")
    assert verdict.allowed
    assert not verdict.authenticated
    ext = {"topic": "orders", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}
    create = signed(RequestCode.UPDATE_AND_CREATE_TOPIC, ext, ak="trusted", secret="wrong")
    assert authorize(RULES, create, "192.0.2.9").allowed  # not an admin, yet trusted by address
    assert authorize(RULES, request, PEER[0]).reason == "bad_signature"


def test_admin_codes_need_an_admin_account() -> None:
    ext = {"topic": "orders", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}
    verdict = authorize(RULES, signed(RequestCode.UPDATE_AND_CREATE_TOPIC, ext, ak="consumer"), PEER[0])
    assert verdict.reason == "admin_required"
    assert "code=17" in verdict.detail
    assert authorize(RULES, signed(RequestCode.UPDATE_AND_CREATE_TOPIC, ext, ak="admin"), PEER[0]).allowed


@pytest.mark.parametrize(
    ("request_", "allowed", "fragment"),
    [
        (send_v2("orders"), True, ""),
        (send_v2("audit"), False, "topic audit"),
        (send_v2("orders", ak="consumer"), False, "PUB permission for topic orders"),
        (pull("orders", ak="consumer"), True, ""),
        (pull("secret", ak="consumer"), False, "topic secret"),
        (pull("orders", "H", ak="consumer"), False, "group H"),
        (pull("%RETRY%G", ak="consumer"), True, ""),
        (heartbeat("G", ["orders", "%RETRY%G"], ak="consumer"), True, ""),
        (heartbeat("G", ["orders", "secret"], ak="consumer"), False, "topic secret"),
        (heartbeat("H", ["orders"], ak="consumer"), False, "group H"),
        (signed(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}), True, ""),
        (signed(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "audit"}), False, "ANY permission"),
        (signed(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}), True, ""),
        (
            signed(
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {"group": "G", "offset": "1", "originTopic": "orders"},
                ak="consumer",
            ),
            False,
            "PUB permission for topic orders",
        ),
        (signed(RequestCode.GET_MAX_OFFSET, {"topic": "audit", "queueId": "0"}), True, ""),
    ],
)
def test_resource_permissions(request_: RemotingCommand, allowed: bool, fragment: str) -> None:
    verdict = authorize(RULES, request_, PEER[0])
    assert verdict.allowed is allowed, verdict.detail
    assert fragment in verdict.detail
    if not allowed:
        assert verdict.reason == "no_permission"
        assert "secret" not in verdict.detail.replace("topic secret", "")


def test_resources_of_each_kind() -> None:
    assert resources(send_v2("%RETRY%G")) == [("%RETRY%G", 8)]
    assert resources(pull("T", "G")) == [("T", 8), ("%RETRY%G", 8)]
    unregister = RemotingCommand(
        RequestCode.UNREGISTER_CLIENT, ext_fields={"clientID": "c", "producerGroup": "P"}
    )
    assert resources(unregister) == []
    batch = json.dumps({"acks": [{"c": "G", "t": "T", "b": ""}]}).encode()
    assert resources(RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, body=batch)) == [
        ("T", 8),
        ("%RETRY%G", 8),
    ]
    assert resources(RemotingCommand(RequestCode.HEART_BEAT, body=b"not json")) == []


# --- through RemotingSession -----------------------------------------------------------------------------


def _session(broker: EmbeddedBroker, ctx: ServerContext, holder: AclHolder, peer: tuple[str, int] = PEER
             ) -> RemotingSession:  # fmt: skip
    return RemotingSession(broker, ctx, peer=peer, acl=holder)


async def test_session_refuses_with_no_permission_and_reports(
    broker: EmbeddedBroker, ctx: ServerContext
) -> None:
    counted: list[tuple[str, str]] = []
    holder = AclHolder(
        RULES, on_denied=lambda protocol, reason: counted.append((protocol, reason)), clock=trio.current_time
    )
    session = _session(broker, ctx, holder)
    with structlog.testing.capture_logs() as logs:
        allowed = await session.handle(send_v2("orders"))
        denied = await session.handle(send_v2("audit"))
        forged = await session.handle(send_v2("orders", secret="producer-secreT"))
    assert allowed is not None
    assert allowed.code == ResponseCode.SUCCESS
    assert denied is not None
    assert denied.code == ResponseCode.NO_PERMISSION
    assert denied.remark is not None
    assert "topic audit" in denied.remark
    assert forged is not None
    assert forged.code == ResponseCode.NO_PERMISSION
    assert counted == [("remoting", "no_permission"), ("remoting", "bad_signature")]
    events = [e for e in logs if e["event"] == "auth.denied"]
    assert [e["reason"] for e in events] == ["no_permission", "bad_signature"]
    assert events[0]["access_key"] == "producer"
    assert events[0]["peer"] == "198.51.100.7:40000"
    text = repr(logs) + (denied.remark or "") + (forged.remark or "")
    assert "producer-secret" not in text
    assert forged.ext_fields.get("Signature") is None
    assert send_v2("orders", secret="producer-secreT").ext_fields["Signature"] not in repr(logs)


async def test_no_rules_means_no_checks(broker: EmbeddedBroker, ctx: ServerContext) -> None:
    session = _session(broker, ctx, AclHolder(clock=trio.current_time))
    response = await session.handle(send_v2("audit", ak=None))
    assert response is not None
    assert response.code == ResponseCode.SUCCESS


async def test_replaced_rules_apply_to_the_next_request(broker: EmbeddedBroker, ctx: ServerContext) -> None:
    holder = AclHolder(RULES, clock=trio.current_time)
    session = _session(broker, ctx, holder)
    first = await session.handle(send_v2("audit"))
    assert first is not None
    assert first.code == ResponseCode.NO_PERMISSION
    holder.replace(
        parse_acl(ACL_YAML.replace("topicPerms: [orders=PUB,", "topicPerms: [audit=PUB, orders=PUB,"), "x")
    )
    second = await session.handle(send_v2("audit"))
    assert second is not None
    assert second.code == ResponseCode.SUCCESS


async def test_failed_authentication_is_throttled_per_address(
    broker: EmbeddedBroker, ctx: ServerContext, autojump_clock: trio.testing.MockClock
) -> None:
    counted: list[str] = []
    throttle = AuthThrottle(free_failures=2, base_delay=1.0, max_delay=4.0)
    holder = AclHolder(
        RULES,
        throttle=throttle,
        on_denied=lambda protocol, reason: counted.append(reason),
        clock=trio.current_time,
    )
    attacker = _session(broker, ctx, holder)
    neighbour = _session(broker, ctx, holder, peer=("198.51.100.8", 1))
    for _ in range(3):
        response = await attacker.handle(send_v2("orders", secret="guess"))
        assert response is not None
    # Backing off: even the right secret is refused unseen until the delay passed.
    refused = await attacker.handle(send_v2("orders"))
    assert refused is not None
    assert refused.code == ResponseCode.NO_PERMISSION
    assert refused.remark is not None
    assert "retry in" in refused.remark
    other = await neighbour.handle(send_v2("orders"))
    assert other is not None
    assert other.code == ResponseCode.SUCCESS
    assert counted == ["bad_signature"] * 3 + ["throttled"]
    await trio.sleep(1.01)
    ok = await attacker.handle(send_v2("orders"))
    assert ok is not None
    assert ok.code == ResponseCode.SUCCESS
    assert throttle.delay_for(PEER[0], trio.current_time()) == 0.0


async def test_permission_denials_do_not_throttle(broker: EmbeddedBroker, ctx: ServerContext) -> None:
    holder = AclHolder(RULES, throttle=AuthThrottle(free_failures=0), clock=trio.current_time)
    session = _session(broker, ctx, holder)
    for _ in range(5):
        denied = await session.handle(send_v2("audit"))
        assert denied is not None
        assert denied.code == ResponseCode.NO_PERMISSION
    assert holder.throttle.delay_for(PEER[0], trio.current_time()) == 0.0


def test_rules_fixture_is_complete() -> None:
    assert isinstance(RULES, AclRules)
    assert set(RULES.accounts) == set(SECRETS)
