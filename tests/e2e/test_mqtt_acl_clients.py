"""paho-mqtt 2.x (3.1.1 and 5.0) against the gateway with an ACL 1.0 account file (``[acl] file``): the
user name is an accessKey and the password its secretKey; the account's topic permissions apply to the
RocketMQ topic an MQTT topic is stored in (its first level).

The proxy runs in-process (trio), the blocking client code in a worker thread; that a message does NOT
arrive is checked with a marker published after it (a subscription's messages arrive in store order).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.server import ServerHandle
from mqproxy.settings import Settings

from ..mqtt.conftest import running_server  # type: ignore[import-not-found]
from .paho_driver import PROTOCOLS, V5, PahoClient  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

ACL = """
accounts:
  - accessKey: meter
    secretKey: meter-secret
    defaultTopicPerm: DENY
    topicPerms: ["readings=PUB|SUB", "config=SUB", "billing=PUB"]
"""


async def in_thread(fn: Callable[..., None], *args: Any) -> None:
    await trio.to_thread.run_sync(fn, *args)


@pytest.fixture
async def server(log_sink: Any, tmp_path: Path) -> AsyncIterator[ServerHandle]:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL, encoding="utf-8")
    async with running_server(Settings.for_tests(acl={"file": str(path)})) as handle:
        yield handle


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_with_account_credentials(server: ServerHandle, log_sink: Any, protocol: int) -> None:
    port = server.address[1]
    refused_code = 135 if protocol == V5 else 128  # SUBACK 0x87 Not authorized / 3.1.1 0x80 Failure

    def scenario() -> None:
        keys = ("meter", "meter-secret")
        sub = PahoClient(port, "meter-sub", protocol, credentials=keys, reconnect=False)
        assert sub.rc == 0, sub.rc
        assert sub.subscribe(("readings/#", 1), ("billing/#", 1), ("config/+", 1)) == [1, refused_code, 1]
        pub = PahoClient(port, "meter-pub", protocol, credentials=keys, reconnect=False)
        assert pub.rc == 0, pub.rc
        pub.publish("readings/m1/kwh", b"42", 1)
        assert sub.get().payload == b"42"
        pub.publish("config/m1", b"forbidden", 1)  # SUB only: not stored (v5: PUBACK 0x87)
        pub.publish("readings/m1/kwh", b"marker", 1)
        assert sub.get().payload == b"marker"
        sub.close()
        pub.close()

        for name, credentials, reason in (
            ("wrong", ("meter", "guess"), "Bad user name or password"),  # 0x86; 3.1.1 return code 4
            ("stranger", ("nobody", "x"), "Bad user name or password"),
            ("anonymous", None, "Not authorized"),  # 0x87; 3.1.1 return code 5
        ):
            client = PahoClient(port, name, protocol, credentials=credentials, reconnect=False)
            assert client.rc.getName() == reason, (name, client.rc)
            client.paho.loop_stop()

    await in_thread(scenario)
    reasons = [(e["access_key"], e["reason"]) for e in log_sink.named("auth.denied")]
    assert reasons == [
        ("meter", "no_permission"),  # SUBSCRIBE billing/#
        ("meter", "no_permission"),  # PUBLISH config/m1
        ("meter", "bad_signature"),
        ("nobody", "unknown_access_key"),
        (None, "no_access_key"),
    ]
