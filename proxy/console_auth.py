"""
mqproxy.console_auth
~~~~~~~~~~~~~~~~~~~~

Who may see the console, sans-IO: :func:`decide` maps a request's ``Authorization`` header, source address
and the settings to a :class:`Verdict`; the HTTP adapter (:mod:`mqproxy.console`) applies it (reports the
refusal through :meth:`mqproxy.acl.holder.AclHolder.denied`, feeds the throttle, answers).

Rules, in order:

1. ``console.enabled = false``: 404, for everyone.
2. An ``[acl] file`` is in force: HTTP Basic with an account's ``accessKey:secretKey`` is required from every
   address (white addresses do not skip it: a browser has no signature to skip).

   * the source address is backing off after failed authentications (the holder's shared
     :class:`~mqproxy.acl.throttle.AuthThrottle`): 429 with ``Retry-After``, credentials not evaluated;
   * no or malformed ``Authorization``: 401 (reason ``no_access_key``; not a guess, so the throttle is not
     fed: a browser's first request never carries credentials);
   * unknown access key or wrong secret (compared in constant time, also for an unknown key): 401
     (``unknown_access_key`` / ``bad_signature``), and the throttle counts a failure;
   * a valid account that is not ``admin: true``: 403 (``admin_required``);
   * an admin: 200 (the throttle forgets the address).

   Every 401 carries ``WWW-Authenticate: Basic realm="mqproxy console"``. No refusal carries data.
3. No ACL file: the console is open to loopback sources (127.0.0.0/8, ::1) only, unless
   ``console.allow_remote = true``; another source gets 403 (``loopback_only``).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass
from typing import Literal

from mqproxy.acl.check import secret_matches
from mqproxy.acl.rules import AclRules

__all__ = ["REALM", "Verdict", "decide", "parse_basic"]

REALM = "mqproxy console"
_CHALLENGE = ("www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
#: Compared against when the access key is unknown, so that answer takes as long as a wrong secret.
_DUMMY_SECRET = "x" * 32

ThrottleAction = Literal["failed", "succeeded"] | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``status`` 200 lets the request through; any other is the whole answer. ``reason`` is the refusal's
    ``auth.denied`` reason (None when allowed or when not an authentication matter: 404)."""

    status: int
    reason: str | None = None
    detail: str = ""
    access_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    throttle: ThrottleAction = None
    #: Whether the refusal is logged (``auth.denied`` and the recent-rejections list).
    emit: bool = True


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic`` value, None if absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep or not user:
        return None
    return user, password


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def decide(
    rules: AclRules | None,
    authorization: str | None,
    ip: str,
    *,
    enabled: bool,
    allow_remote: bool,
    throttle_wait_s: float = 0.0,
) -> Verdict:
    """The answer to one console request (see the module rules); ``throttle_wait_s`` is the holder's
    throttle's ``delay_for(ip, now)``."""
    if not enabled:
        return Verdict(404, detail="console disabled")
    if rules is None:
        if allow_remote or is_loopback(ip):
            return Verdict(200)
        return Verdict(
            403,
            reason="loopback_only",
            detail=f"console: loopback only without an ACL file (source {ip}); see console.allow_remote",
        )
    if throttle_wait_s > 0:
        wait = max(1, round(throttle_wait_s + 0.5))
        return Verdict(
            429,
            reason="throttled",
            detail=f"too many failed authentications from {ip}; retry in {throttle_wait_s:.1f} s",
            headers=(("retry-after", str(wait)),),
            emit=False,
        )
    credentials = parse_basic(authorization)
    if credentials is None:
        return Verdict(
            401,
            reason="no_access_key",
            detail="console: no Basic credentials",
            headers=(_CHALLENGE,),
            emit=False,
        )
    access_key, secret = credentials
    account = rules.account(access_key)
    if account is None:
        secret_matches(_DUMMY_SECRET, secret)
        return Verdict(
            401,
            reason="unknown_access_key",
            detail="console: unknown accessKey",
            access_key=access_key,
            headers=(_CHALLENGE,),
            throttle="failed",
        )
    if not secret_matches(account.secret_key, secret):
        return Verdict(
            401,
            reason="bad_signature",
            detail="console: wrong secretKey",
            access_key=access_key,
            headers=(_CHALLENGE,),
            throttle="failed",
        )
    if not account.admin:
        return Verdict(
            403,
            reason="admin_required",
            detail="console: admin accounts only",
            access_key=access_key,
            throttle="succeeded",
        )
    return Verdict(200, access_key=access_key, throttle="succeeded")
