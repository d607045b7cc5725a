"""Who may see the console (sans-IO): admin accounts with their keys when an ACL file is set, loopback only
(unless allowed) without one; refusals say why and carry a challenge where a login can help."""

from __future__ import annotations

import base64

import pytest

from mqproxy.acl.rules import AclRules, parse_acl
from mqproxy.console_auth import decide, is_loopback, parse_basic

ACL = """\
accounts:
  - accessKey: root
    secretKey: root-secret-1
    admin: true
  - accessKey: app
    secretKey: app-secret-1
"""


@pytest.fixture
def rules() -> AclRules:
    return parse_acl(ACL, "plain_acl.yml")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_parse_basic() -> None:
    assert parse_basic(_basic("root", "a:b")) == ("root", "a:b")  # the password may hold colons
    assert parse_basic("basic " + base64.b64encode(b"u:").decode()) == ("u", "")
    b64 = base64.b64encode
    bad_values = [None, "", "Bearer x", "Basic", "Basic !!!", "Basic " + b64(b"nocolon").decode()]
    bad_values += ["Basic " + b64(b":pw").decode(), "Basic " + b64(b"\xff:x").decode()]
    for bad in bad_values:
        assert parse_basic(bad) is None


def test_admin_is_let_in_and_forgiven(rules: AclRules) -> None:
    verdict = decide(rules, _basic("root", "root-secret-1"), "10.0.0.9", enabled=True, allow_remote=False)
    assert (verdict.status, verdict.access_key, verdict.throttle) == (200, "root", "succeeded")


@pytest.mark.parametrize(
    ("authorization", "status", "reason", "throttle"),
    [
        (None, 401, "no_access_key", None),
        ("Basic garbage!", 401, "no_access_key", None),
        (_basic("nobody", "x"), 401, "unknown_access_key", "failed"),
        (_basic("root", "guess-123"), 401, "bad_signature", "failed"),
        (_basic("app", "app-secret-1"), 403, "admin_required", "succeeded"),
    ],
)
def test_refusals(
    rules: AclRules, authorization: str | None, status: int, reason: str, throttle: str | None
) -> None:
    verdict = decide(rules, authorization, "127.0.0.1", enabled=True, allow_remote=True)
    assert (verdict.status, verdict.reason, verdict.throttle) == (status, reason, throttle)
    challenged = ("www-authenticate", 'Basic realm="mqproxy console", charset="UTF-8"') in verdict.headers
    assert challenged == (status == 401)
    assert "guess-123" not in verdict.detail
    assert "secret-1" not in verdict.detail


def test_a_backing_off_address_is_refused_unseen(rules: AclRules) -> None:
    verdict = decide(rules, _basic("root", "root-secret-1"), "10.0.0.9", enabled=True, allow_remote=False,
                     throttle_wait_s=1.2)  # fmt: skip
    assert (verdict.status, verdict.reason, verdict.emit, verdict.throttle) == (429, "throttled", False, None)
    assert ("retry-after", "2") in verdict.headers


def test_without_acl_loopback_only_unless_allowed() -> None:
    assert decide(None, None, "127.0.0.1", enabled=True, allow_remote=False).status == 200
    assert decide(None, None, "::1", enabled=True, allow_remote=False).status == 200
    refused = decide(None, None, "10.1.2.3", enabled=True, allow_remote=False)
    assert (refused.status, refused.reason) == (403, "loopback_only")
    assert decide(None, None, "10.1.2.3", enabled=True, allow_remote=True).status == 200


def test_disabled_is_not_found(rules: AclRules) -> None:
    assert decide(None, None, "127.0.0.1", enabled=False, allow_remote=True).status == 404
    admin = _basic("root", "root-secret-1")
    assert decide(rules, admin, "127.0.0.1", enabled=False, allow_remote=True).status == 404


def test_is_loopback() -> None:
    assert is_loopback("127.8.9.1")
    assert is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1") is False
    assert not is_loopback("memory")
    assert not is_loopback("192.168.1.1")
