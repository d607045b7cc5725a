"""
mqproxy.mqtt.access
~~~~~~~~~~~~~~~~~~~

:class:`MqttAccess`: who may CONNECT and what each connection may publish and subscribe to, from two
sources: the ACL 1.0 account file (:mod:`mqproxy.acl`, user name = accessKey, password = secretKey) and
the ``[mqtt]`` users and acl tables (:class:`~mqproxy.mqtt.auth.Authorizer`). Without an account file
(the holder has no rules) the ``[mqtt]`` tables alone decide, as before.

With an account file loaded, a CONNECT is admitted when:

* its source address matches a ``globalWhiteRemoteAddresses`` pattern (as in RocketMQ, every account
  check is skipped, credentials or not); or
* its user name is an account's accessKey and the password is that account's secretKey (UTF-8), or the
  source address matches the account's ``whiteRemoteAddress`` (the password is then not checked, as
  RocketMQ skips the signature); or
* the ``[mqtt] users`` table accepts the user name and password (either source may accept).

Otherwise it is refused: no user name → Not authorized (0x87; 3.1.1 return code 5; ``allow_anonymous``
does not open a server with an account file); anything else → Bad user name or password (0x86; 3.1.1: 4).

Topics: a connection admitted through an account may PUBLISH to an MQTT topic only if the account has PUB
on the RocketMQ topic it is stored in (:func:`~mqproxy.mqtt.mapping.parent_topic`: its first level), and
SUBSCRIBE to a filter only with SUB on that topic; a filter whose first level is a wildcard may reach every
topic, so it needs SUB by default and on every topic the account lists. The ``[mqtt] acl`` patterns
apply on top, to every connection. Permissions are looked up in the rules in force at each PUBLISH and
SUBSCRIBE, so a reload applies to open connections too (an account removed by it is refused everything);
the credentials are checked only at CONNECT. A refusal is answered as the ``[mqtt] acl`` answers it
(PUBACK/PUBREC 0x87, SUBACK 0x87 / 3.1.1 0x80, a Will topic refused at CONNECT with 0x87 / 5).

The account file, the throttle and the refusal reporter are the connection's
:class:`~mqproxy.acl.holder.AclHolder` (``ConnectionContext.acl``, the server's one holder). Failed CONNECTs
are throttled per source address (``AclHolder.throttle``), with or without an account file: while the
address backs off, its CONNECTs are refused unseen with Connection rate exceeded (0x9F; 3.1.1: Server
unavailable, 3), reason ``throttled`` (counted, not logged); a globally white address is never throttled.
Each other refused CONNECT, and each PUBLISH or SUBSCRIBE the account file refuses, is reported through
``AclHolder.denied`` (``auth.denied``, ``mqproxy_auth_denied_total{protocol="mqtt"}``; reasons
``no_access_key``, ``unknown_access_key``, ``bad_signature`` for a wrong password, ``no_permission``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mqproxy.acl.check import check_topic, perm_allows, secret_matches
from mqproxy.acl.holder import AclHolder
from mqproxy.acl.rules import Account, Perm
from mqproxy.codecs.mqtt import MqttCodecError, ReasonCode, parse_topic_filter
from mqproxy.mqtt.auth import ALLOW_ALL, Authorizer
from mqproxy.mqtt.mapping import parent_topic
from mqproxy.mqtt.outcomes import Permission

__all__ = ["Admission", "MqttAccess", "peer_text", "subscribable"]

PROTOCOL = "mqtt"
_WILDCARDS = ("+", "#")


def peer_text(peer: tuple[str, int]) -> str:
    """``host:port`` (an IPv6 host bracketed), as log events write addresses."""
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class _Reporter:
    """Reports a topic the account file refuses to one connection."""

    holder: AclHolder
    log: Any
    peer: tuple[str, int]

    def __call__(self, access_key: str, detail: str) -> None:
        self.holder.denied(
            self.log,
            protocol=PROTOCOL,
            peer=peer_text(self.peer),
            access_key=access_key,
            reason="no_permission",
            detail=detail,
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to a CONNECT: its ``verdict`` and, if admitted, the connection's topic permissions."""

    verdict: ReasonCode
    can_publish: Permission
    can_subscribe: Permission


def _deny_all(client_id: str, username: str | None, topic: str) -> bool:
    return False


def subscribable(account: Account, topic_filter: str) -> str | None:
    """None if ``account`` may subscribe to the (valid) ``topic_filter``, else why not."""
    try:
        inner = parse_topic_filter(topic_filter).filter
    except MqttCodecError:
        return f"invalid topic filter {topic_filter[:64]!r}"
    first = inner.partition("/")[0]
    if first not in _WILDCARDS:
        return check_topic(account, parent_topic(inner), Perm.SUB)
    if not perm_allows(account.default_topic_perm, Perm.SUB):
        return f"No default SUB permission for a wildcard filter (accessKey={account.access_key})"
    for topic, owned in account.topic_perms.items():
        if not perm_allows(owned, Perm.SUB):
            return f"No SUB permission for topic {topic}, which {inner[:64]!r} may reach"
    return None


class MqttAccess:
    """The gateway's CONNECT and topic decisions (see the module docstring)."""

    def __init__(self, users: Authorizer = ALLOW_ALL) -> None:
        self.users = users
        #: The admission by ``users`` for each verdict, shared by every connection it admits (its
        #: permissions are bound methods: one pair per user table, not per connection).
        self._admitted: dict[ReasonCode, tuple[Authorizer, Admission]] = {}

    async def connect(
        self, username: str | None, password: bytes | None, peer: tuple[str, int], holder: AclHolder, log: Any
    ) -> Admission:
        """Decide a CONNECT with these credentials from ``peer`` under ``holder``'s rules; refusals are
        reported to ``log``."""
        ip = peer[0]
        throttle = holder.throttle
        wait = throttle.delay_for(ip, holder.clock())
        rules = holder.rules
        if wait > 0 and (rules is None or not rules.globally_white(ip)):
            holder.denied(
                log,
                protocol=PROTOCOL,
                peer=peer_text(peer),
                access_key=username,
                reason="throttled",
                detail=f"too many failed authentications from {ip}; retry in {wait:.1f} s",
                emit=False,
            )
            return Admission(ReasonCode.CONNECTION_RATE_EXCEEDED, _deny_all, _deny_all)
        admission, reason = await self._decide(username, password, ip, _Reporter(holder, log, peer))
        if admission.verdict == ReasonCode.SUCCESS:
            throttle.succeeded(ip)
        else:
            throttle.failed(ip, holder.clock())
            holder.denied(
                log,
                protocol=PROTOCOL,
                peer=peer_text(peer),
                access_key=username,
                reason=reason,
                detail=f"CONNECT: {admission.verdict.name}",
            )
        return admission

    def _users_admission(self, verdict: ReasonCode) -> Admission:
        users = self.users
        cached = self._admitted.get(verdict)
        if cached is None or cached[0] is not users:
            cached = self._admitted[verdict] = (
                users,
                Admission(verdict, users.can_publish, users.can_subscribe),
            )
        return cached[1]

    async def _decide(
        self, username: str | None, password: bytes | None, ip: str, report: _Reporter
    ) -> tuple[Admission, str]:
        rules = report.holder.rules
        known = username in self.users.users
        if rules is None:
            verdict = await self.users.authenticate(username, password)
            if username is None:
                return self._users_admission(verdict), "no_access_key"
            return self._users_admission(verdict), "bad_signature" if known else "unknown_access_key"
        if rules.globally_white(ip):
            return self._users_admission(ReasonCode.SUCCESS), ""
        if username is None:
            return Admission(ReasonCode.NOT_AUTHORIZED, _deny_all, _deny_all), "no_access_key"
        account = rules.account(username)
        if account is not None and rules.account_white(account, ip):  # trusted: no password or topic checks
            return self._users_admission(ReasonCode.SUCCESS), ""
        if account is not None and self._secret_matches(account, password):
            return self._account_admission(account, report), ""
        if known:  # the second source
            verdict = await self.users.authenticate(username, password)
            if verdict == ReasonCode.SUCCESS:
                return self._users_admission(verdict), ""
        reason = "bad_signature" if account is not None or known else "unknown_access_key"
        return Admission(ReasonCode.BAD_USER_NAME_OR_PASSWORD, _deny_all, _deny_all), reason

    @staticmethod
    def _secret_matches(account: Account, password: bytes | None) -> bool:
        if password is None:
            return False
        try:
            given = password.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return secret_matches(account.secret_key, given)

    def _account_admission(self, account: Account, report: _Reporter) -> Admission:
        users = self.users
        holder, access_key = report.holder, account.access_key

        def current() -> Account | None:
            """The account as the rules in force now have it (a reload applies to open connections)."""
            rules = holder.rules
            return None if rules is None else rules.account(access_key)

        def can_publish(client_id: str, username: str | None, topic: str) -> bool:
            now = current()
            why = (
                f"No acl config for {access_key}"
                if now is None
                else check_topic(now, parent_topic(topic), Perm.PUB)
            )
            if why is not None:
                report(access_key, f"PUBLISH {topic[:128]}: {why}")
                return False
            return users.can_publish(client_id, username, topic)

        def can_subscribe(client_id: str, username: str | None, topic_filter: str) -> bool:
            now = current()
            why = f"No acl config for {access_key}" if now is None else subscribable(now, topic_filter)
            if why is not None:
                report(access_key, f"SUBSCRIBE {topic_filter[:128]}: {why}")
                return False
            return users.can_subscribe(client_id, username, topic_filter)

        return Admission(ReasonCode.SUCCESS, can_publish, can_subscribe)
