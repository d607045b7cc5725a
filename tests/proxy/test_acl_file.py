"""The ``[acl] file`` end to end in one process: start-up errors, enforcement on a real socket, reload on
change (good and broken files), and the ``mqproxy_auth_denied_total`` counter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_acl import sign
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.settings import Settings

from ..conftest import read_until_eof  # type: ignore[import-not-found]

pytestmark = pytest.mark.usefixtures("log_sink")

ACL = """\
accounts:
  - accessKey: app
    secretKey: app-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - orders=PUB
"""


def _send(topic: str, opaque: int, secret: str = "app-secret-1") -> bytes:
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000001",
           "h": "0", "i": "TAGS\x01A\x02"}  # fmt: skip
    sign(ext, b"body", "app", secret)
    return encode_command(
        RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, ext_fields=ext, body=b"body")
    )


class Client:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.decoder, self.opaque = stream, FrameDecoder(), 0

    async def send(self, topic: str, secret: str = "app-secret-1") -> RemotingCommand:
        self.opaque += 1
        await self.stream.send_all(_send(topic, self.opaque, secret))
        with trio.fail_after(10):
            while True:
                commands = self.decoder.receive_data(await self.stream.receive_some(65536))
                if commands:
                    return commands[0]


async def _metrics(address: tuple[str, int]) -> str:
    stream = await trio.open_tcp_stream(*address)
    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return (await read_until_eof(stream)).decode()


def _rewrite(path: Path, text: str) -> None:
    """Replace the file's content and make sure its stamp changes even on a coarse-mtime file system."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


async def test_enforced_reloaded_and_counted(
    tmp_path: Path, start_server: Any, log_sink: Any, wait_for: Any
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    settings = Settings.for_tests(acl={"file": str(acl_file), "reload_interval_s": 0.05})
    async with start_server(settings) as handle:
        client = Client(await trio.open_tcp_stream(*handle.address))
        assert (await client.send("orders")).code == ResponseCode.SUCCESS
        denied = await client.send("audit")
        assert denied.code == ResponseCode.NO_PERMISSION
        assert "topic audit" in (denied.remark or "")
        forged = await client.send("orders", secret="app-secret-2")
        assert forged.code == ResponseCode.NO_PERMISSION
        assert "Check signature failed for accessKey=app" == forged.remark

        _rewrite(acl_file, ACL + "      - audit=PUB\n")
        await wait_for(lambda: len(log_sink.named("acl.reloaded")) == 1)
        assert log_sink.named("acl.reloaded")[0]["accounts"] == 1
        assert (await client.send("audit")).code == ResponseCode.SUCCESS

        _rewrite(acl_file, ACL.replace("  - accessKey: app", "  - accessKey: [app"))
        await wait_for(lambda: len(log_sink.named("acl.reload_failed")) == 1)
        failed = log_sink.named("acl.reload_failed")[0]
        assert failed["path"] == str(acl_file)
        assert failed["line"] == 3
        assert (await client.send("audit")).code == ResponseCode.SUCCESS  # the old rules stay

        text = await _metrics(handle.address)
        assert 'mqproxy_auth_denied_total{protocol="remoting",reason="no_permission"} 1.0' in text
        assert 'mqproxy_auth_denied_total{protocol="remoting",reason="bad_signature"} 1.0' in text
    events = log_sink.named("auth.denied")
    assert [e["reason"] for e in events] == ["no_permission", "bad_signature"]
    assert all("app-secret" not in repr(e) for e in log_sink.events)


def _serve(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``mqproxy serve`` over ``tmp_path / "d"`` with ``env``, run to its exit (a start-up error)."""
    argv = [
        sys.executable,
        "-m",
        "mqproxy",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "d"),
    ]
    return subprocess.run(argv, capture_output=True, timeout=60, env=env)


def test_malformed_file_stops_the_start_with_status_2_naming_the_line(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(
        "accounts:\n  - accessKey: app\n    secretKey: s\n    whiteRemoteAddress: 10.0.0.999\n"
    )
    env = {**os.environ, "MQPROXY_ACL_FILE": str(acl_file)}
    proc = _serve(tmp_path, env)
    assert proc.returncode == 2
    assert f"acl.file: {acl_file}:4: white remote address".encode() in proc.stderr
    assert not (tmp_path / "d").exists()


def test_missing_file_is_a_startup_error(tmp_path: Path) -> None:
    proc = _serve(tmp_path, {**os.environ, "MQPROXY_ACL_FILE": str(tmp_path / "nope.yml")})
    assert proc.returncode == 2
    assert b"cannot read" in proc.stderr
