"""Parsing plain_acl.yml into AclRules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.acl.rules import AclFileError, Perm, parse_acl, parse_perm

SAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: "12345678"
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - "%RETRY%groupB=PUB|SUB"
      - groupC=SUB
  - accessKey: rocketmq2
    secretKey: "12345678"
    whiteRemoteAddress: 192.168.1.*
    admin: true
"""


def test_sample_file() -> None:
    rules = parse_acl(SAMPLE, "plain_acl.yml")
    assert rules.global_white_remote_addresses == ("10.10.103.*", "192.168.0.*")
    first = rules.account("RocketMQ")
    assert first is not None
    assert first.secret_key == "12345678"
    assert first.admin is False
    assert first.white_remote_address == ""
    assert first.default_topic_perm == Perm.DENY
    assert first.default_group_perm == Perm.SUB
    assert dict(first.topic_perms) == {"topicA": Perm.DENY, "topicB": Perm.PUB | Perm.SUB, "topicC": Perm.SUB}
    assert dict(first.group_perms) == {"groupA": Perm.DENY, "groupB": Perm.PUB | Perm.SUB, "groupC": Perm.SUB}
    second = rules.account("rocketmq2")
    assert second is not None
    assert second.admin is True
    # Missing defaults are DENY, as RocketMQ's parsePermFromString(null).
    assert second.default_topic_perm == Perm.DENY
    assert rules.account("nobody") is None
    assert rules.globally_white("192.168.0.7")
    assert not rules.globally_white("192.168.1.7")
    assert rules.account_white(second, "192.168.1.7")
    assert not rules.account_white(first, "192.168.1.7")


def test_secret_not_in_repr() -> None:
    account = parse_acl(SAMPLE, "x").account("RocketMQ")
    assert "12345678" not in repr(account)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PUB", Perm.PUB),
        ("SUB", Perm.SUB),
        (" PUB|SUB ", Perm.PUB | Perm.SUB),
        ("SUB|PUB", Perm.PUB | Perm.SUB),
        ("DENY", Perm.DENY),
        ("pub", Perm.DENY),
        ("ANY", Perm.DENY),
        (None, Perm.DENY),
    ],
)
def test_parse_perm(text: object, expected: Perm) -> None:
    assert parse_perm(text) == expected


@pytest.mark.parametrize("text", ["", "# only a comment\n", "accounts: []\n", "accounts:\n"])
def test_empty_files_have_no_accounts(text: str) -> None:
    rules = parse_acl(text, "x")
    assert dict(rules.accounts) == {}
    assert rules.global_white_remote_addresses == ()


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("accounts:\n  - accessKey: a\n    secretKey: [1\n", 4, "YAML"),
        ("- just\n- a list\n", 1, "mapping"),
        ("accounts:\n  - secretKey: s\n", 2, "accessKey"),
        ("accounts:\n  - accessKey: ak\n", 2, "secretKey"),
        ("accounts:\n  - accessKey: ak\n    secretKey: s\n    whiteRemoteAddress: 1.2.3.400\n", 4, "address"),
        ("globalWhiteRemoteAddresses:\n  - 10.*\n  - bogus\n", 3, "address"),
        (
            "accounts:\n  - accessKey: ak\n    secretKey: s\n    topicPerms:\n      - t1=PUB\n      - t2\n",
            6,
            "NAME=PERM",
        ),
        ("accounts:\n  - accessKey: ak\n    secretKey: s\n  - accessKey: ak\n    secretKey: t\n", 4, "twice"),
        ("accounts:\n  - accessKey: ak\n    secretKey: s\n    admin: maybe\n", 4, "admin"),
        ("accounts: 3\n", 1, "list"),
    ],
)
def test_malformed_files_name_the_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(AclFileError) as info:
        parse_acl(text, "/etc/acl.yml")
    assert info.value.line == line
    assert fragment in info.value.message
    assert str(info.value).startswith(f"/etc/acl.yml:{line}: ")


@given(st.text(max_size=300))
@settings(max_examples=400, deadline=None)
def test_any_text_parses_or_raises_acl_file_error(text: str) -> None:
    error: AclFileError | None = None
    try:
        rules = parse_acl(text, "fuzz.yml")
    except AclFileError as exc:
        error = exc
    if error is not None:
        assert str(error).startswith("fuzz.yml")
    else:
        assert all(isinstance(key, str) for key in rules.accounts)


@given(st.lists(st.sampled_from(["accounts:", "  - accessKey: a", "    secretKey: s", "    topicPerms:",
                                 "      - t=PUB", "      - x", "    whiteRemoteAddress: 1.2.*", "  - {}",
                                 "globalWhiteRemoteAddresses: [a]", "    admin: true", "  -", ": :"]),
                max_size=12))  # fmt: skip
@settings(max_examples=400, deadline=None)
def test_structured_fuzz_parses_or_raises_acl_file_error(lines: list[str]) -> None:
    line: int | None = None
    try:
        parse_acl("\n".join(lines) + "\n", "fuzz.yml")
    except AclFileError as exc:
        line = exc.line
    assert line is None or 1 <= line <= len(lines) + 1
