"""
mqproxy.acl.check
~~~~~~~~~~~~~~~~~

Permission questions about one account, answered as RocketMQ's ``PlainPermissionChecker`` does: the
resource's own permission when listed, else the account's default; DENY always wins; ANY is satisfied by
PUB or SUB. Each check returns ``None`` when allowed, else a reason naming the resource and the permission
(safe to send to the client and to log: it never contains a secret).
"""

from __future__ import annotations

import hmac

from mqproxy.acl.rules import Account, Perm, plain_group

__all__ = ["check_group", "check_topic", "perm_allows", "perm_name", "secret_matches"]


def perm_allows(owned: Perm, need: Perm) -> bool:
    """RocketMQ ``Permission.checkPermission(need, owned)``."""
    if owned & Perm.DENY:
        return False
    if need & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(need & owned)


def perm_name(perm: Perm) -> str:
    """``PUB``, ``SUB``, ``PUB|SUB``, ``ANY`` or ``DENY``."""
    names = [
        name
        for name, bit in (("DENY", Perm.DENY), ("ANY", Perm.ANY), ("PUB", Perm.PUB), ("SUB", Perm.SUB))
        if perm & bit
    ]
    return "|".join(names) or "NONE"


def check_topic(account: Account, topic: str, need: Perm) -> str | None:
    """``None`` if ``account`` may use ``topic`` with ``need``, else why not."""
    owned = account.topic_perms.get(topic)
    if owned is None:
        if perm_allows(account.default_topic_perm, need):
            return None
        return f"No default {perm_name(need)} permission for topic {topic} (accessKey={account.access_key})"
    if perm_allows(owned, need):
        return None
    return f"No {perm_name(need)} permission for topic {topic} (accessKey={account.access_key})"


def check_group(account: Account, group: str, need: Perm) -> str | None:
    """Like :func:`check_topic` for a consumer group; ``%RETRY%g`` is checked as ``g``."""
    name = plain_group(group)
    owned = account.group_perms.get(name)
    if owned is None:
        if perm_allows(account.default_group_perm, need):
            return None
        return f"No default {perm_name(need)} permission for group {name} (accessKey={account.access_key})"
    if perm_allows(owned, need):
        return None
    return f"No {perm_name(need)} permission for group {name} (accessKey={account.access_key})"


def secret_matches(expected: str, given: str) -> bool:
    """Constant-time comparison of two secrets or signatures (UTF-8)."""
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8"))
