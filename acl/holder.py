"""
mqproxy.acl.holder
~~~~~~~~~~~~~~~~~~

:class:`AclHolder` keeps the live :class:`~mqproxy.acl.rules.AclRules` and what every protocol shares
when it enforces them: the failed-authentication :class:`~mqproxy.acl.throttle.AuthThrottle` and the one
way to report a refusal (:meth:`AclHolder.denied`: the ``auth.denied`` event and the
``mqproxy_auth_denied_total`` counter).

Protocol layers read ``.rules`` on every check (``None`` means no ``[acl] file`` is configured: nothing is
checked); a reload calls :meth:`AclHolder.replace`, an attribute swap, so a check sees either the old or
the new rules whole. The server keeps one holder (``ServerState.acl``) and hands the same object to every
connection (``ConnectionContext.acl``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqproxy.acl.rules import AclRules
from mqproxy.acl.throttle import AuthThrottle

__all__ = ["DENIAL_REASONS", "AclHolder"]

#: The ``reason`` values of ``auth.denied`` and of the counter's ``reason`` label (a bounded set).
DENIAL_REASONS = frozenset(
    {
        "no_access_key",  # no credentials where the file requires them
        "unknown_access_key",  # an accessKey / user name the file does not know
        "bad_signature",  # wrong signature or password
        "throttled",  # refused unseen: the source address is backing off after failures
        "admin_required",  # an admin-only request from a non-admin account
        "no_permission",  # the account lacks the topic or group permission
    }
)
#: Reasons that are failed *authentication* (they feed the throttle).
AUTHENTICATION_FAILURES = frozenset({"no_access_key", "unknown_access_key", "bad_signature"})

DeniedHook = Callable[[str, str], None]
#: ``(protocol, peer, access_key, reason, detail)`` of one logged refusal (the console's recent rejections).
RefusalHook = Callable[[str, str, "str | None", str, str], None]


def _ignore(protocol: str, reason: str) -> None:
    return None


def _ignore_refusal(protocol: str, peer: str, access_key: str | None, reason: str, detail: str) -> None:
    return None


class AclHolder:
    """The current rules (swapped whole on reload), the shared throttle and the refusal reporter.

    ``clock`` (monotonic seconds; the server gives ``time.monotonic``) is the one clock every caller of the
    throttle reads. ``on_denied(protocol, reason)`` is
    called once per refusal (the server counts it in ``/metrics``);
    ``on_refusal(protocol, peer, access_key, reason, detail)`` once per *logged* refusal (the server keeps
    the last few for the console; the unlogged flood of throttled attempts is left out).
    """

    def __init__(
        self,
        rules: AclRules | None = None,
        *,
        throttle: AuthThrottle | None = None,
        on_denied: DeniedHook | None = None,
        clock: Callable[[], float],
    ) -> None:
        self.rules: AclRules | None = rules
        self.throttle = AuthThrottle() if throttle is None else throttle
        #: The throttle's clock: every protocol passes ``clock()`` as its ``now`` (one clock for the shared
        #: per-address state; tests may give trio's).
        self.clock = clock
        self.on_denied: DeniedHook = _ignore if on_denied is None else on_denied
        self.on_refusal: RefusalHook = _ignore_refusal
        #: Bumped on every replace, so caches keyed on the rules can notice a reload.
        self.generation = 0

    def replace(self, rules: AclRules) -> None:
        self.rules = rules
        self.generation += 1

    def denied(
        self,
        log: Any,
        *,
        protocol: str,
        peer: str,
        access_key: str | None,
        reason: str,
        detail: str,
        emit: bool = True,
    ) -> None:
        """Report one refusal: count it and (unless ``emit`` is False, e.g. for the flood of throttled
        attempts) log ``auth.denied``. ``detail`` must hold no secret (the check reasons never do)."""
        self.on_denied(protocol, reason)
        if emit:
            self.on_refusal(protocol, peer, access_key, reason, detail)
            log.warning(
                "auth.denied",
                protocol=protocol,
                peer=peer,
                access_key=access_key,
                reason=reason,
                detail=detail,
            )
