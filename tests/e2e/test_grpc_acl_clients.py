"""The official RocketMQ 5 gRPC clients against mqproxy with an ACL 1.0 account file (``[acl] file``):
the Java client (``rocketmq-client-java`` 5.2.0, ``StaticSessionCredentialsProvider``; driver
``tests/e2e/java/grpc5/AclGrpc5.java``: upper-case hex signatures) and the Go client
(``rocketmq-clients/golang/v5``, ``Config.Credentials``; driver ``tests/e2e/go/grpc5``: lower-case hex and
``Credential=AK//Rocketmq``).

For each: the right keys send, receive and ack; a wrong secret key and no credentials are refused with
UNAUTHORIZED; publishing to a topic the account may only read is refused: both clients announce the topic
in their Telemetry settings before the first send, so the stream ends with PERMISSION_DENIED and the client
gives up (Go: the producer does not start, naming the missing permission; Java: the send is cancelled).
The proxy's ``auth.denied`` events and ``mqproxy_auth_denied_total`` count the refusals and never hold
a secret. mqproxy only: the stock RocketMQ 5.3.3 cluster the other gRPC tests use runs without ACL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .conftest import Client, ClientRun, ProxyProcess  # type: ignore[import-not-found]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

AK, SK = "e2eApp", "e2e-Secret-42"
ACL = f"""
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: ["AclJava=PUB|SUB", "AclGo=PUB|SUB", "AclReadOnly=SUB"]
"""
RUN_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def acl_proxy(proxy_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    base = tmp_path_factory.mktemp("acl-proxy")
    (base / "data").mkdir()
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL, encoding="utf-8")
    proc = ProxyProcess(proxy_bin, base / "data", base, {"MQPROXY_ACL_FILE": str(acl_file)})
    proc.start()
    yield proc
    if proc.proc is not None:
        rc = proc.stop()
        assert rc == 0, f"proxy exited with {rc} on SIGTERM:\n{proc.diagnostics()}"


def denials(proxy: ProxyProcess, since: int) -> list[dict[str, Any]]:
    assert proxy.reader is not None
    return [e for e in proxy.reader.events[since:] if e.get("event") == "auth.denied"]


def log_mark(proxy: ProxyProcess) -> int:
    return len(proxy.reader.events) if proxy.reader is not None else 0


def assert_no_secret(proxy: ProxyProcess) -> None:
    assert proxy.reader is not None
    assert all(SK not in str(e) for e in proxy.reader.events)


# ------------------------------------------------------------------------------------------------- Java


@pytest.fixture(scope="module")
def java_acl(java_driver: Callable[..., Client]) -> Client:
    return java_driver("grpc5", "mqtest.AclGrpc5", ("grpc-java",))


def java_events(run: ClientRun, scenario: str, event: str) -> list[dict[str, Any]]:
    return [e for e in run.reader.events if e.get("scenario") == scenario and e.get("event") == event]


def test_java_client_with_an_account_file(acl_proxy: ProxyProcess, java_acl: Client) -> None:
    mark = log_mark(acl_proxy)
    args = (acl_proxy.address, AK, SK, "AclJava", "AclJavaGroup", "AclReadOnly")
    # the refusals run last: failed authentication from 127.0.0.1 backs the address off (throttle)
    allowed = java_acl.spawn(*args, "right", "forbidden").wait(RUN_TIMEOUT_S)
    refused_run = java_acl.spawn(*args, "wrong", "anonymous").wait(RUN_TIMEOUT_S)
    run = allowed
    (done,) = java_events(run, "right", "scenario.done")
    assert done["ok"], run.describe()
    (sent,) = java_events(run, "right", "sent")
    received = java_events(run, "right", "received")
    assert sent["id"] in {e["id"] for e in received}, run.describe()
    assert {e["body"] for e in received} == {"acl-right"}

    for scenario in ("wrong", "anonymous"):
        assert not java_events(refused_run, scenario, "accepted"), refused_run.describe()
        (refused,) = java_events(refused_run, scenario, "refused")
        assert "UnauthorizedException" in refused["root_type"] + refused["type"], (scenario, refused)
    # the producer announces the new topic in its Telemetry settings before sending: the stream ends with
    # PERMISSION_DENIED and the client gives the send up (it reports a CancellationException)
    assert not java_events(run, "forbidden", "accepted"), run.describe()
    (refused,) = java_events(run, "forbidden", "refused")
    assert refused["type"] in ("java.util.concurrent.CancellationException",
                               "org.apache.rocketmq.client.java.exception.ForbiddenException"), refused

    reasons = {(e["access_key"], e["reason"]) for e in denials(acl_proxy, mark)}
    assert (AK, "bad_signature") in reasons
    assert (None, "no_access_key") in reasons
    assert (AK, "no_permission") in reasons
    assert_no_secret(acl_proxy)


# --------------------------------------------------------------------------------------------------- Go


@pytest.fixture(scope="module")
def grpc5(go_driver: Callable[[str], Client]) -> Client:
    return go_driver("grpc5")


def test_go_client_with_an_account_file(acl_proxy: ProxyProcess, grpc5: Client) -> None:
    mark = log_mark(acl_proxy)
    endpoint = acl_proxy.address
    keys = ("--ak", AK, "--sk", SK)
    sender = grpc5.spawn("send", "--endpoint", endpoint, "--topic", "AclGo", "--count", "2", *keys)
    sender.wait(RUN_TIMEOUT_S)
    assert (sender.done() or {}).get("ok") is True, sender.describe()
    sent = {e["msgId"] for e in sender.of("sent")}
    assert len(sent) == 2
    receiver = grpc5.spawn("receive", "--endpoint", endpoint, "--group", "AclGoGroup", "--topic", "AclGo",
                           "--expect", "2", "--timeout", "60s", *keys)
    receiver.wait(RUN_TIMEOUT_S)
    assert (receiver.done() or {}).get("ok") is True, receiver.describe()
    assert {e["msgId"] for e in receiver.of("received")} == sent

    # the producer announces its topic in its Telemetry settings at start: refused there (PERMISSION_DENIED
    # ends the stream, so the client does not start), or else at the send (FORBIDDEN)
    forbidden = grpc5.spawn("send", "--endpoint", endpoint, "--topic", "AclReadOnly", *keys)
    forbidden.wait(RUN_TIMEOUT_S)
    assert not forbidden.of("sent"), forbidden.describe()
    done = forbidden.done()
    assert done is not None, forbidden.describe()
    assert done["ok"] is False, forbidden.describe()
    refused_at_start = "No PUB permission for topic AclReadOnly" in str(done.get("reason"))
    refused_at_send = [e["code"] for e in forbidden.of("error")] == ["FORBIDDEN"]
    assert refused_at_start or refused_at_send, forbidden.describe()

    # the refusals run last, one after the other: failed authentication from 127.0.0.1 backs the address
    # off (the throttle), after which its calls are refused UNAUTHORIZED unseen
    anonymous = grpc5.spawn("send", "--endpoint", endpoint, "--topic", "AclGo").wait(RUN_TIMEOUT_S)
    wrong = grpc5.spawn("send", "--endpoint", endpoint, "--topic", "AclGo", "--ak", AK, "--sk", "guess")
    wrong.wait(RUN_TIMEOUT_S)
    for run in (anonymous, wrong):
        done = run.done()
        assert done is not None, run.describe()
        assert done["ok"] is False, run.describe()
        assert not run.of("sent"), run.describe()
        assert "UNAUTHORIZED" in str(done.get("reason")) + str(run.of("error")), run.describe()

    reasons = {(e["access_key"], e["reason"]) for e in denials(acl_proxy, mark)}
    assert (None, "no_access_key") in reasons
    assert (AK, "bad_signature") in reasons or "too many failed authentications" in wrong.describe()
    assert (AK, "no_permission") in reasons
    assert_no_secret(acl_proxy)
