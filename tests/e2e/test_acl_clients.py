"""ACL 1.0 with real remoting clients signing their requests: the 4.x Java client (``AclClientRPCHook`` of
rocketmq-acl 4.9.8), rocketmq-client-go v2 (``primitive.Credentials``) and the C++ core
(``set_session_credentials``; skipped when not installed). Each sends to and consumes from a topic its
account may use, and is refused with NO_PERMISSION on one it may not; a wrong secret is refused; a changed
file takes effect without a restart and a broken one leaves the old rules in force.

mqproxy only: the stock RocketMQ side of these tests would need its own ACL-enabled broker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import Client, ProxyProcess  # type: ignore[import-not-found]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

RUN_TIMEOUT = 120.0
AK, SK = "e2e-app", "e2e-secret-1"
RUN = uuid.uuid4().hex[:8]
OK = {client: f"AclOk{client}_{RUN}" for client in ("java", "go", "py044", "pycvs")}
DENIED = f"AclDenied_{RUN}"
GROUP = f"AclGroup_{RUN}"


def acl_yaml(extra_topics: tuple[str, ...] = ()) -> str:
    topics = [f"{t}=PUB|SUB" for t in (*OK.values(), *extra_topics)] + [f"{DENIED}=SUB"]
    groups = [f"{GROUP}{c}=SUB" for c in OK]
    return (
        "accounts:\n"
        f"  - accessKey: {AK}\n"
        f"    secretKey: {SK}\n"
        "    defaultTopicPerm: DENY\n"
        "    defaultGroupPerm: DENY\n"
        f"    topicPerms: {topics}\n"
        f"    groupPerms: {groups}\n"
    ).replace("'", '"')


def _proxy(new_proxy: Callable[..., ProxyProcess], path: Path) -> ProxyProcess:
    path.write_text(acl_yaml())
    return new_proxy(env={"MQPROXY_ACL_FILE": str(path), "MQPROXY_ACL_RELOAD_INTERVAL_S": "0.1"})


def _denials(proxy: ProxyProcess, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in list(proxy.reader.events) if e.get("event") == "auth.denied" and e.get("reason") == reason
    ]


@pytest.fixture
def java(java_driver: Callable[..., Client]) -> Client:
    return java_driver("acl", "mqtest.Acl", ("client4",))


def _java_send(java: Client, proxy: ProxyProcess, topic: str, count: int, secret: str = SK) -> Any:
    return java.run(proxy.address, AK, secret, "send", topic, str(count), timeout=RUN_TIMEOUT)


def test_java_signed_send_consume_and_denied_topic(
    java: Client, new_proxy: Callable[..., ProxyProcess], tmp_path: Path
) -> None:
    proxy = _proxy(new_proxy, tmp_path / "plain_acl.yml")
    sent = _java_send(java, proxy, OK["java"], 3)
    assert [e["status"] for e in sent.of("sent")] == ["SEND_OK"] * 3, sent.describe()
    consumed = java.run(proxy.address, AK, SK, "consume", OK["java"], GROUP + "java", "3", "60000",
                        timeout=RUN_TIMEOUT)  # fmt: skip
    assert sorted(e["body"] for e in consumed.of("received")) == ["acl-0", "acl-1", "acl-2"], (
        consumed.describe()
    )
    assert consumed.done() == {"event": "done", "ok": True}

    denied = _java_send(java, proxy, DENIED, 1)
    assert not denied.of("sent")
    (failure,) = denied.of("send.failed")
    assert failure["code"] == 16, denied.describe()
    assert f"No PUB permission for topic {DENIED}" in failure["message"]
    assert _denials(proxy, "no_permission")
    assert all(SK not in line for line in proxy.reader.lines)


def test_java_wrong_secret_refused_and_reload(
    java: Client, new_proxy: Callable[..., ProxyProcess], tmp_path: Path
) -> None:
    path = tmp_path / "plain_acl.yml"
    proxy = _proxy(new_proxy, path)
    extra = f"AclLater_{RUN}"
    before = _java_send(java, proxy, extra, 1)
    assert [e["code"] for e in before.of("send.failed")] == [16], before.describe()

    stamp = path.stat().st_mtime_ns + 2_000_000_000
    path.write_text(acl_yaml((extra,)))
    os.utime(path, ns=(stamp, stamp))
    assert proxy.reader.wait_for(lambda e: e.get("event") == "acl.reloaded", 30), proxy.diagnostics()
    after = _java_send(java, proxy, extra, 1)
    assert [e["status"] for e in after.of("sent")] == ["SEND_OK"], after.describe()

    path.write_text("accounts:\n  - accessKey: [broken\n")
    os.utime(path, ns=(stamp + 2_000_000_000, stamp + 2_000_000_000))
    failed = proxy.reader.wait_for(lambda e: e.get("event") == "acl.reload_failed", 30)
    assert failed is not None
    assert failed["line"] == 3
    still = _java_send(java, proxy, extra, 1)
    assert [e["status"] for e in still.of("sent")] == ["SEND_OK"], still.describe()

    # Last: a wrong secret (it makes the proxy back off this address for a few seconds).
    forged = _java_send(java, proxy, OK["java"], 1, secret="not-the-secret")
    assert not forged.of("sent")
    assert forged.of("send.failed"), forged.describe()
    assert _denials(proxy, "bad_signature")
    assert all("not-the-secret" not in line for line in proxy.reader.lines)


def test_go_v2_credentials(go_driver: Callable[[str], Client], new_proxy: Callable[..., ProxyProcess],
                           tmp_path: Path) -> None:  # fmt: skip
    go = go_driver("remoting")
    proxy = _proxy(new_proxy, tmp_path / "plain_acl.yml")
    creds = ("--ak", AK, "--sk", SK)
    sent = go.run("produce", "--namesrv", proxy.address, "--group", "GoAclPG", "--topic", OK["go"], "--count",
                  "3", *creds, timeout=RUN_TIMEOUT)  # fmt: skip
    assert [e["status"] for e in sent.of("sent")] == ["SEND_OK"] * 3, sent.describe()
    consumed = go.run("consume", "--namesrv", proxy.address, "--group", GROUP + "go", "--topic", OK["go"],
                      "--expect", "3", "--timeout", "60s", *creds, timeout=RUN_TIMEOUT)  # fmt: skip
    assert len(consumed.of("received")) == 3, consumed.describe()
    denied = go.run("produce", "--namesrv", proxy.address, "--group", "GoAclPG", "--topic", DENIED,
                    "--timeout", "10s", *creds, timeout=RUN_TIMEOUT)  # fmt: skip
    assert not denied.of("sent")
    assert denied.of("error"), denied.describe()
    assert any(DENIED in e.get("detail", "") for e in _denials(proxy, "no_permission"))


@pytest.mark.parametrize("name", ["py044", "pycvs"])
def test_cpp_core_credentials(client: Callable[[str], Client], new_proxy: Callable[..., ProxyProcess],
                              tmp_path: Path, name: str) -> None:  # fmt: skip
    cpp = client(name)
    proxy = _proxy(new_proxy, tmp_path / "plain_acl.yml")
    creds = ("--ak", AK, "--sk", SK)
    sent = cpp.run("produce", "--namesrv", proxy.address, "--topic", OK[name], "--count", "3", *creds,
                   timeout=RUN_TIMEOUT)  # fmt: skip
    assert len(sent.of("sent")) == 3, sent.describe()
    consumer = cpp.spawn("consume", "--namesrv", proxy.address, "--topic", OK[name], "--group", GROUP + name,
                         "--expect", "3", "--timeout", "60", *creds)  # fmt: skip
    consumed = consumer.wait(RUN_TIMEOUT)
    assert len(consumed.of("received")) == 3, consumed.describe()
    denied = cpp.run("produce", "--namesrv", proxy.address, "--topic", DENIED, *creds, timeout=RUN_TIMEOUT)
    assert not denied.of("sent")
    assert denied.of("send.failed"), denied.describe()
    assert _denials(proxy, "no_permission")
