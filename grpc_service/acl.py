"""
mqproxy.grpc_service.acl
~~~~~~~~~~~~~~~~~~~~~~~~

ACL 1.0 accounts on gRPC calls, sans-IO: who sent a call (:func:`authenticate`), what it needs
(:func:`needs_of`, :func:`settings_needs`) and whether that is granted (:func:`authorize`). The trio side
(back-off, events, answering) is :mod:`.guard`.

Authentication, in RocketMQ ACL 1.0's order:

1. A source address matching a ``globalWhiteRemoteAddresses`` pattern skips every check.
2. No ``authorization`` header: ``no_access_key``; an access key with no account: ``unknown_access_key``.
3. A source address matching the account's ``whiteRemoteAddress`` skips the signature check.
4. A header that does not parse (:mod:`mqproxy.codecs.grpc_auth`), no ``x-mq-date-time``, or a signature
   that is not HmacSHA1(secretKey, date-time): ``bad_signature``. The date-time is not checked against
   the clock (neither does RocketMQ's proxy).

All of these, and a call refused unseen while its address backs off after failures (``throttled``, see
:mod:`.guard`), are answered UNAUTHORIZED (40100). Permissions (answered FORBIDDEN (40300), reason
``no_permission``) follow the resource mapping of RocketMQ's proxy (``DefaultAuthorizationContextBuilder``):

=================================================  ==============================================
call                                               needs
=================================================  ==============================================
SendMessage                                        PUB on every topic of its messages
EndTransaction, RecallMessage                      PUB on the topic
QueryRoute                                         PUB or SUB (ANY) on the topic
QueryAssignment, ReceiveMessage, AckMessage,       SUB on the group and SUB on the topic
ChangeInvisibleDuration, ForwardMessageToDLQ,
PullMessage, UpdateOffset, GetOffset
QueryOffset                                        SUB on the topic (the call names no group)
Heartbeat (consumers only), NotifyClientTermination  SUB on the group
Telemetry ``settings``                             PUB on each publishing topic; SUB on the
                                                   subscription's group and on each of its topics
=================================================  ==============================================

A resource the request leaves empty is not checked (the handler refuses the request itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mqproxy.acl.check import check_group, check_topic
from mqproxy.acl.rules import Account, AclRules, Perm
from mqproxy.codecs import grpc_auth
from mqproxy.codecs import rocketmq_v2 as pb

__all__ = [
    "Denial",
    "Identity",
    "Need",
    "authenticate",
    "authorize",
    "needs_of",
    "settings_needs",
]

#: The reason of a permission refusal (the others are failed authentication); reasons are
#: :data:`mqproxy.acl.holder.DENIAL_REASONS`.
FORBIDDEN = "no_permission"

_CONSUMERS = frozenset(
    {pb.ClientType.PUSH_CONSUMER, pb.ClientType.SIMPLE_CONSUMER, pb.ClientType.PULL_CONSUMER}
)


@dataclass(frozen=True, slots=True)
class Need:
    """One permission a call needs: ``perm`` on the topic or group ``name``."""

    kind: Literal["topic", "group"]
    name: str
    perm: Perm


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. ``account`` None: a globally white address, which every check lets pass."""

    access_key: str | None
    account: Account | None


@dataclass(frozen=True, slots=True)
class Denial:
    """A refused call: ``reason`` is one of :data:`mqproxy.acl.holder.DENIAL_REASONS`, ``message`` what
    the client is told (never a secret), ``access_key`` the key the caller named (if any)."""

    reason: str
    message: str
    access_key: str | None = None

    @property
    def forbidden(self) -> bool:
        """True for a permission denial (FORBIDDEN), False for failed authentication (UNAUTHORIZED)."""
        return self.reason == FORBIDDEN

    @property
    def code(self) -> pb.Code:
        return pb.Code.FORBIDDEN if self.forbidden else pb.Code.UNAUTHORIZED


WHITE = Identity(None, None)


def authenticate(rules: AclRules, metadata: Mapping[str, str], ip: str) -> Identity | Denial:
    """Who sent a call with ``metadata`` from ``ip`` under ``rules`` (see the module docstring)."""
    if rules.globally_white(ip):
        return WHITE
    value = metadata.get(grpc_auth.AUTHORIZATION)
    if not value:
        return Denial("no_access_key", "No accessKey is configured")
    try:
        auth = grpc_auth.parse_authorization(value)
    except grpc_auth.AuthorizationError as exc:
        return Denial("bad_signature", f"authorization header is incorrect: {exc}")
    access_key = auth.access_key
    account = rules.account(access_key)
    if account is None:
        return Denial("unknown_access_key", f"No acl config for {access_key}", access_key)
    if rules.account_white(account, ip):  # as RocketMQ's ACL 1.0: trusted, no signature or permission check
        return Identity(access_key, None)
    date_time = metadata.get(grpc_auth.DATE_TIME)
    if not date_time:
        return Denial("bad_signature", f"{grpc_auth.DATE_TIME} is required for the signature", access_key)
    if not grpc_auth.verify(auth, account.secret_key, date_time):
        return Denial("bad_signature", f"Check signature failed for accessKey={access_key}", access_key)
    return Identity(access_key, account)


def authorize(identity: Identity, needs: tuple[Need, ...]) -> Denial | None:
    """None if ``identity`` holds every one of ``needs``, else the first refusal."""
    account = identity.account
    if account is None:
        return None
    for need in needs:
        check = check_topic if need.kind == "topic" else check_group
        why = check(account, need.name, need.perm)
        if why is not None:
            return Denial(FORBIDDEN, why, identity.access_key)
    return None


def _topic(resource: Any, perm: Perm) -> tuple[Need, ...]:
    name = resource.name
    return (Need("topic", name, perm),) if name else ()


def _group(resource: Any) -> tuple[Need, ...]:
    name = resource.name
    return (Need("group", name, Perm.SUB),) if name else ()


def _consume(request: Any, topic: Any) -> tuple[Need, ...]:
    return _group(request.group) + _topic(topic, Perm.SUB)


def _send(request: Any) -> tuple[Need, ...]:
    topics = dict.fromkeys(m.topic.name for m in request.messages if m.topic.name)
    return tuple(Need("topic", name, Perm.PUB) for name in topics)


def _heartbeat(request: Any) -> tuple[Need, ...]:
    return _group(request.group) if request.client_type in _CONSUMERS else ()


_NEEDS: dict[str, Any] = {
    "SendMessage": _send,
    "EndTransaction": lambda r: _topic(r.topic, Perm.PUB),
    "RecallMessage": lambda r: _topic(r.topic, Perm.PUB),
    "QueryRoute": lambda r: _topic(r.topic, Perm.ANY),
    "QueryAssignment": lambda r: _consume(r, r.topic),
    "ReceiveMessage": lambda r: _consume(r, r.message_queue.topic),
    "AckMessage": lambda r: _consume(r, r.topic),
    "ChangeInvisibleDuration": lambda r: _consume(r, r.topic),
    "ForwardMessageToDeadLetterQueue": lambda r: _consume(r, r.topic),
    "PullMessage": lambda r: _consume(r, r.message_queue.topic),
    "UpdateOffset": lambda r: _consume(r, r.message_queue.topic),
    "GetOffset": lambda r: _consume(r, r.message_queue.topic),
    "QueryOffset": lambda r: _topic(r.message_queue.topic, Perm.SUB),
    "Heartbeat": _heartbeat,
    "NotifyClientTermination": lambda r: _group(r.group),
}


def needs_of(method: str, request: Any) -> tuple[Need, ...]:
    """The permissions the unary or server-streaming call ``method`` with ``request`` needs (none for a
    call that touches no resource)."""
    build = _NEEDS.get(method)
    return build(request) if build is not None else ()


def settings_needs(settings: Any) -> tuple[Need, ...]:
    """The permissions a Telemetry ``settings`` command announces."""
    which = settings.WhichOneof("pub_sub")
    if which == "publishing":
        topics = dict.fromkeys(t.name for t in settings.publishing.topics if t.name)
        return tuple(Need("topic", name, Perm.PUB) for name in topics)
    if which == "subscription":
        subscription = settings.subscription
        topics = dict.fromkeys(e.topic.name for e in subscription.subscriptions if e.topic.name)
        return _group(subscription.group) + tuple(Need("topic", name, Perm.SUB) for name in topics)
    return ()
