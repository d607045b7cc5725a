"""Tests for mqproxy.grpc_service.acl: authentication of a call's metadata and the per-RPC resource mapping
(sans-IO, no sockets)."""

from __future__ import annotations

import pytest

from mqproxy.acl.holder import DENIAL_REASONS
from mqproxy.acl.rules import AclRules, Perm, parse_acl
from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_auth import authorization_value
from mqproxy.grpc_service.acl import (
    WHITE,
    Denial,
    Identity,
    Need,
    authenticate,
    authorize,
    needs_of,
    settings_needs,
)

ACL = """
globalWhiteRemoteAddresses: ["10.9.*.*"]
accounts:
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: ["Orders=PUB|SUB", "Audit=PUB", "Feed=SUB"]
    groupPerms: ["Blocked=DENY"]
  - accessKey: lan
    secretKey: lan-secret
    whiteRemoteAddress: 192.168.7.*
    defaultTopicPerm: DENY
"""
DATE = "20261128T081500Z"


@pytest.fixture
def rules() -> AclRules:
    return parse_acl(ACL, "plain_acl.yml")


def _md(ak: str = "app", sk: str = "app-secret", **kw: str) -> dict[str, str]:
    return {"x-mq-date-time": DATE, "authorization": authorization_value(ak, sk, DATE), **kw}


def test_right_keys_authenticate_java_and_go_forms(rules: AclRules) -> None:
    java = authenticate(rules, _md(), "127.0.0.1")
    go = authenticate(
        rules,
        {"x-mq-date-time": DATE, "authorization": authorization_value(
            "app", "app-secret", DATE, upper=False, credential_suffix="//Rocketmq")},
        "127.0.0.1",
    )
    assert isinstance(java, Identity)
    assert java.access_key == "app"
    assert java.account is rules.account("app")
    assert go == java


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ({"x-mq-date-time": DATE}, "no_access_key"),
        ({"x-mq-date-time": DATE, "authorization": "Basic YXBwOnNlY3JldA=="}, "bad_signature"),
        (_md("nobody", "x"), "unknown_access_key"),
        (_md(sk="wrong"), "bad_signature"),
        ({"authorization": authorization_value("app", "app-secret", DATE)}, "bad_signature"),
        ({**_md(), "x-mq-date-time": "20261128T081501Z"}, "bad_signature"),
    ],
)
def test_failed_authentication_is_unauthorized(
    rules: AclRules, metadata: dict[str, str], reason: str
) -> None:
    denial = authenticate(rules, metadata, "127.0.0.1")
    assert isinstance(denial, Denial)
    assert denial.reason == reason
    assert denial.reason in DENIAL_REASONS
    assert denial.code == pb.Code.UNAUTHORIZED
    assert "secret" not in denial.message


def test_global_white_address_skips_every_check(rules: AclRules) -> None:
    assert authenticate(rules, {}, "10.9.1.2") is WHITE
    assert authorize(WHITE, (Need("topic", "Anything", Perm.PUB),)) is None


def test_account_white_address_skips_signature_and_permissions(rules: AclRules) -> None:
    identity = authenticate(rules, _md("lan", "not-the-secret"), "192.168.7.20")
    assert isinstance(identity, Identity)
    assert identity.access_key == "lan"
    assert authorize(identity, (Need("topic", "NotListedAnywhere", Perm.PUB),)) is None
    assert isinstance(authenticate(rules, _md("lan", "not-the-secret"), "192.168.8.20"), Denial)


def test_permissions_follow_topic_and_group_perms(rules: AclRules) -> None:
    identity = authenticate(rules, _md(), "127.0.0.1")
    assert isinstance(identity, Identity)
    assert authorize(identity, (Need("topic", "Orders", Perm.PUB), Need("group", "G", Perm.SUB))) is None
    denial = authorize(identity, (Need("topic", "Feed", Perm.PUB),))
    assert denial is not None
    assert (denial.code, denial.reason, denial.access_key) == (pb.Code.FORBIDDEN, "no_permission", "app")
    assert "Feed" in denial.message
    assert authorize(identity, (Need("topic", "Other", Perm.SUB),)) is not None  # default DENY
    assert authorize(identity, (Need("group", "Blocked", Perm.SUB),)) is not None
    assert authorize(identity, (Need("topic", "Audit", Perm.ANY),)) is None  # QueryRoute: PUB or SUB


def _res(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def _mq(topic: str) -> pb.MessageQueue:
    return pb.MessageQueue(topic=_res(topic), id=0)


def _topic(name: str, perm: Perm) -> Need:
    return Need("topic", name, perm)


def _group(name: str) -> Need:
    return Need("group", name, Perm.SUB)


@pytest.mark.parametrize(
    ("method", "request_", "needs"),
    [
        ("SendMessage", pb.SendMessageRequest(messages=[pb.RmqMessage(topic=_res(t)) for t in "TTU"]),
         (_topic("T", Perm.PUB), _topic("U", Perm.PUB))),
        ("EndTransaction", pb.EndTransactionRequest(topic=_res("T")), (_topic("T", Perm.PUB),)),
        ("RecallMessage", pb.RecallMessageRequest(topic=_res("T")), (_topic("T", Perm.PUB),)),
        ("QueryRoute", pb.QueryRouteRequest(topic=_res("T")), (_topic("T", Perm.ANY),)),
        ("QueryAssignment", pb.QueryAssignmentRequest(topic=_res("T"), group=_res("G")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("ReceiveMessage", pb.ReceiveMessageRequest(group=_res("G"), message_queue=_mq("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("AckMessage", pb.AckMessageRequest(group=_res("G"), topic=_res("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest(group=_res("G"), topic=_res("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("ForwardMessageToDeadLetterQueue",
         pb.ForwardMessageToDeadLetterQueueRequest(group=_res("G"), topic=_res("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("PullMessage", pb.PullMessageRequest(group=_res("G"), message_queue=_mq("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("UpdateOffset", pb.UpdateOffsetRequest(group=_res("G"), message_queue=_mq("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("GetOffset", pb.GetOffsetRequest(group=_res("G"), message_queue=_mq("T")),
         (_group("G"), _topic("T", Perm.SUB))),
        ("QueryOffset", pb.QueryOffsetRequest(message_queue=_mq("T")), (_topic("T", Perm.SUB),)),
        ("Heartbeat", pb.HeartbeatRequest(group=_res("G"), client_type=pb.ClientType.SIMPLE_CONSUMER),
         (_group("G"),)),
        ("Heartbeat", pb.HeartbeatRequest(client_type=pb.ClientType.PRODUCER), ()),
        ("NotifyClientTermination", pb.NotifyClientTerminationRequest(group=_res("G")), (_group("G"),)),
        ("NotifyClientTermination", pb.NotifyClientTerminationRequest(), ()),
        ("ReceiveMessage", pb.ReceiveMessageRequest(), ()),  # empty names: the handler refuses them
    ],
)
def test_resource_mapping(method: str, request_: object, needs: tuple[Need, ...]) -> None:
    assert needs_of(method, request_) == needs


def test_settings_needs() -> None:
    publishing = pb.Settings(publishing=pb.Publishing(topics=[_res("A"), _res("B"), _res("A")]))
    assert settings_needs(publishing) == (_topic("A", Perm.PUB), _topic("B", Perm.PUB))
    subscription = pb.Settings(subscription=pb.Subscription(
        group=_res("G"), subscriptions=[pb.SubscriptionEntry(topic=_res("T"))]))
    assert settings_needs(subscription) == (_group("G"), _topic("T", Perm.SUB))
    assert settings_needs(pb.Settings()) == ()
