"""Permission checks as RocketMQ's PlainPermissionChecker."""

from __future__ import annotations

import pytest

from mqproxy.acl.check import check_group, check_topic, perm_allows, secret_matches
from mqproxy.acl.holder import AclHolder
from mqproxy.acl.rules import Account, Perm, parse_acl

RULES = parse_acl(
    """\
accounts:
  - accessKey: ak
    secretKey: sk
    defaultTopicPerm: SUB
    defaultGroupPerm: DENY
    topicPerms: [orders=PUB, audit=DENY, both=PUB|SUB]
    groupPerms: [g1=SUB, "g2=SUB|PUB"]
""",
    "x",
)


def _account() -> Account:
    account = RULES.account("ak")
    assert account is not None
    return account


@pytest.mark.parametrize(
    ("owned", "need", "allowed"),
    [
        (Perm.PUB, Perm.PUB, True),
        (Perm.PUB, Perm.SUB, False),
        (Perm.PUB | Perm.SUB, Perm.SUB, True),
        (Perm.DENY | Perm.PUB, Perm.PUB, False),
        (Perm.SUB, Perm.ANY, True),
        (Perm.DENY, Perm.ANY, False),
        (Perm.PUB, Perm.PUB | Perm.SUB, True),  # RocketMQ: any overlap suffices
    ],
)
def test_perm_allows(owned: Perm, need: Perm, allowed: bool) -> None:
    assert perm_allows(owned, need) is allowed


def test_topic_checks() -> None:
    account = _account()
    assert check_topic(account, "orders", Perm.PUB) is None
    reason = check_topic(account, "orders", Perm.SUB)
    assert reason is not None
    assert "orders" in reason
    assert "SUB" in reason
    assert check_topic(account, "audit", Perm.SUB) is not None
    assert check_topic(account, "both", Perm.SUB) is None
    # Unlisted topics fall back to the default (SUB).
    assert check_topic(account, "other", Perm.SUB) is None
    default_reason = check_topic(account, "other", Perm.PUB)
    assert default_reason is not None
    assert "default" in default_reason
    assert "sk" not in default_reason.replace("ak", "")


def test_group_checks_strip_retry_prefix() -> None:
    account = _account()
    assert check_group(account, "g1", Perm.SUB) is None
    assert check_group(account, "%RETRY%g1", Perm.SUB) is None
    assert check_group(account, "g2", Perm.PUB) is None
    reason = check_group(account, "%RETRY%g3", Perm.SUB)
    assert reason is not None
    assert "g3" in reason
    assert "%RETRY%" not in reason


def test_secret_matches() -> None:
    assert secret_matches("abc", "abc")
    assert not secret_matches("abc", "abd")
    assert not secret_matches("abc", "")
    assert secret_matches("ü", "ü")


def test_holder_swaps() -> None:
    holder = AclHolder(clock=lambda: 0.0)
    assert holder.rules is None
    holder.replace(RULES)
    assert holder.rules is RULES
    assert holder.generation == 1
