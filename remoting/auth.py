"""
mqproxy.remoting.auth
~~~~~~~~~~~~~~~~~~~~~

RocketMQ ACL 1.0 on remoting requests, sans-IO: :func:`authorize` decides one request against the live
:class:`~mqproxy.acl.rules.AclRules`, in the order of RocketMQ's ``PlainPermissionManager.validate``:

1. the source address matches a global white pattern: allowed, nothing else is checked;
2. no ``AccessKey`` ext field: ``No accessKey is configured``; an unknown one: ``No acl config for <ak>``;
3. the address matches the account's ``whiteRemoteAddress``: the signature is not checked;
4. the ``Signature`` ext field must equal Base64(HmacSHA1(secretKey, content)) as
   :mod:`mqproxy.codecs.remoting_acl` computes it (ext field values sorted by key, ``Signature`` and
   ``_UNIQUE_KEY_QUERY`` left out, then the body; the Go client's variant without ``SecurityToken`` is
   accepted too): ``Check signature failed for accessKey=<ak>``;
5. admin-only codes (17, 25, 200, 207, 215) need ``admin: true``;
6. each resource the request names needs its permission (:func:`resources`), listed or by default.

Which resources (after the 4.9.8 broker's ``PlainAccessResource.parse``, plus the 5.x additions for the
name-server role this proxy also plays): sends need PUB on the topic (a send to ``%RETRY%g`` needs SUB on
group g); pulls, pops, acks and offset requests need SUB on the topic and on the consumer group;
CONSUMER_SEND_MSG_BACK needs SUB on the group and PUB on the original topic; HEART_BEAT needs SUB on each
consumer group and each subscribed topic; UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP and queue locks
SUB on the group; QUERY_MESSAGE SUB on the topic; END_TRANSACTION PUB on the topic when the header names
one; GET_ROUTEINFO_BY_TOPIC PUB or SUB on the topic (SUB on the group for ``%RETRY%g``), as 5.x checks,
except ``TBW102``: a producer denied a topic's route falls back to that template's route and then gets
the send's clear NO_PERMISSION (and no route look-up auto-creates a topic its account may not use).
A topic named ``%RETRY%g`` is always checked as group g. Every other code needs authentication only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import orjson

from mqproxy.acl.check import check_group, check_topic, secret_matches
from mqproxy.acl.rules import RETRY_PREFIX, AclRules, Perm
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_acl import ACCESS_KEY, SECURITY_TOKEN, SIGNATURE, signature_of
from mqproxy.codecs.remoting_codes import RequestCode
from mqproxy.model.topics import AUTO_CREATE_TEMPLATE_TOPIC

__all__ = ["ADMIN_CODES", "Verdict", "authorize", "resources"]

#: RocketMQ ``Permission.ADMIN_CODE``: UPDATE_AND_CREATE_TOPIC, UPDATE_BROKER_CONFIG,
#: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP, DELETE_TOPIC_IN_BROKER.
ADMIN_CODES = frozenset({17, 25, 200, 207, 215})

_SUB, _PUB = Perm.SUB, Perm.PUB
_QUEUE_GROUP_CODES = frozenset(
    {
        RequestCode.PULL_MESSAGE,
        RequestCode.LITE_PULL_MESSAGE,
        RequestCode.QUERY_CONSUMER_OFFSET,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        RequestCode.POP_MESSAGE,
        RequestCode.PEEK_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        RequestCode.NOTIFICATION,
        RequestCode.POLLING_INFO,
        RequestCode.POP_ROLLBACK,
    }
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision on one request. ``reason`` is an ``auth.denied`` reason token when refused; ``detail``
    the NO_PERMISSION remark (it names what was denied, never a secret). ``authenticated`` is True when a
    signature was verified (a success that clears the address's failed-authentication back-off)."""

    allowed: bool
    access_key: str | None = None
    reason: str | None = None
    detail: str = ""
    authenticated: bool = False


def _json(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _dicts(value: object) -> Iterator[Mapping[str, object]]:
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, dict))


def _text(data: Mapping[str, object], *keys: str) -> str | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def resources(request: RemotingCommand) -> list[tuple[str, Perm]]:
    """``(name, permission)`` pairs the request needs; a name ``%RETRY%g`` means group g, any other name a
    topic. A body that does not parse names nothing (its handler refuses it anyway)."""
    f = request.ext_fields
    code = request.code
    out: list[tuple[str, Perm]] = []

    def add(name: str | None, need: Perm) -> None:
        if name:
            out.append((name, need))

    def group(name: str | None) -> None:
        if name:
            out.append((name if name.startswith(RETRY_PREFIX) else RETRY_PREFIX + name, _SUB))

    if code == RequestCode.SEND_MESSAGE:
        topic = f.get("topic")
        add(topic, _SUB if topic and topic.startswith(RETRY_PREFIX) else _PUB)
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        topic = f.get("b", f.get("topic"))
        add(topic, _SUB if topic and topic.startswith(RETRY_PREFIX) else _PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        group(f.get("group"))
        add(f.get("originTopic"), _PUB)
    elif code in _QUEUE_GROUP_CODES:
        add(f.get("topic"), _SUB)
        group(f.get("consumerGroup"))
    elif code == RequestCode.QUERY_MESSAGE:
        add(f.get("topic"), _SUB)
    elif code == RequestCode.HEART_BEAT:
        data = _json(request.body)
        if isinstance(data, dict):
            for consumer in _dicts(data.get("consumerDataSet")):
                group(_text(consumer, "groupName"))
                for sub in _dicts(consumer.get("subscriptionDataSet")):
                    add(_text(sub, "topic"), _SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        group(f.get("consumerGroup"))
    elif code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        data = _json(request.body)
        if isinstance(data, dict):
            group(_text(data, "consumerGroup"))
    elif code == RequestCode.BATCH_ACK_MESSAGE:
        data = _json(request.body)
        if isinstance(data, dict):
            for entry in _dicts(data.get("acks")):
                add(_text(entry, "t", "topic"), _SUB)
                group(_text(entry, "c", "consumerGroup"))
    elif code == RequestCode.END_TRANSACTION:
        add(f.get("topic"), _PUB)
    elif code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
        topic = f.get("topic")
        if topic != AUTO_CREATE_TEMPLATE_TOPIC:  # producers fall back to its route: authentication only
            add(topic, _SUB if topic and topic.startswith(RETRY_PREFIX) else Perm.ANY)
    return out


def _signature_ok(fields: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """The Java client's signature; or, when a ``SecurityToken`` is present, rocketmq-client-go's, which
    leaves the token out of the signed content (ACL 1.0 never checks the token itself)."""
    given = fields.get(SIGNATURE, "")
    if secret_matches(signature_of(fields, body, secret_key), given):
        return True
    if SECURITY_TOKEN not in fields:
        return False
    unsigned = {key: value for key, value in fields.items() if key != SECURITY_TOKEN}
    return secret_matches(signature_of(unsigned, body, secret_key), given)


def authorize(rules: AclRules, request: RemotingCommand, ip: str) -> Verdict:
    """Decide ``request`` from ``ip`` (the client's address, no port); see the module docstring."""
    fields = request.ext_fields
    access_key = fields.get(ACCESS_KEY) or None
    if rules.globally_white(ip):
        return Verdict(True, access_key)
    if access_key is None:
        return Verdict(False, None, "no_access_key", "No accessKey is configured")
    account = rules.account(access_key)
    if account is None:
        return Verdict(False, access_key, "unknown_access_key", f"No acl config for {access_key}")
    if rules.account_white(account, ip):  # as PlainPermissionManager: no signature, admin or resource check
        return Verdict(True, access_key)
    if not _signature_ok(fields, request.body or b"", account.secret_key):
        return Verdict(
            False, access_key, "bad_signature", f"Check signature failed for accessKey={access_key}"
        )
    authenticated = True
    if request.code in ADMIN_CODES and not account.admin:
        detail = f"Need admin permission for request code={request.code}, but accessKey={access_key} is not"
        return Verdict(False, access_key, "admin_required", detail, authenticated)
    for name, need in resources(request):
        if name.startswith(RETRY_PREFIX):
            reason = check_group(account, name, need)
        else:
            reason = check_topic(account, name, need)
        if reason is not None:
            return Verdict(False, access_key, "no_permission", reason, authenticated)
    return Verdict(True, access_key, authenticated=authenticated)
