"""The benchmarks' one remoting client (trio): pipelined SEND_MESSAGE_V2 and PULL_MESSAGE, oneway sends,
the SEND_MESSAGE_V2 request builder, plus the helpers that run mqproxy in a subprocess and read its CPU
time and peak RSS.

Frames are built with :func:`mqproxy.codecs.remoting.encode_command` and read with
:class:`~mqproxy.codecs.remoting.FrameDecoder`; responses are matched to requests by opaque, so any
number of requests may be outstanding on one connection.

    async with open_client(port) as client:
        ack = await client.send("Topic", body, queue_id=0)
        pulled = await client.pull("Topic", 0, offset=0)
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from mqproxy.codecs.message_record import DecodedRecord, decode_records, encode_properties
from mqproxy.codecs.remoting import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode

__all__ = [
    "ConnectionLost",
    "ProxyProcess",
    "PullReply",
    "RemotingClient",
    "SendAck",
    "cpu_seconds",
    "open_client",
    "peak_rss_kib",
    "send_message_command",
    "start_proxy",
]

#: Java client version ordinal the requests claim (V4_9_4).
CLIENT_VERSION = 413
PULL_FLAG_SUBSCRIPTION = 0x4
_RECEIVE_BYTES = 256 * 1024


def send_message_command(
    group: str,
    topic: str,
    body: bytes,
    *,
    queue_id: int,
    properties: dict[str, str],
    queue_nums: int = 4,
    sys_flag: int = 0,
) -> RemotingCommand:
    """A SEND_MESSAGE_V2 request as a Java producer builds it (``TBW102`` the auto-create template)."""
    ext = {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": str(queue_nums),
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(time.time_ns() // 1_000_000),
        "h": "0",
        "i": encode_properties(properties),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    return RemotingCommand(
        code=RequestCode.SEND_MESSAGE_V2, version=CLIENT_VERSION, ext_fields=ext, body=body
    )


class ConnectionLost(Exception):
    """The server closed the connection (or it broke) while requests were outstanding."""


@dataclass(frozen=True, slots=True)
class SendAck:
    """The answer to one send: response code, and where the message went when ``code`` is SUCCESS."""

    code: int
    remark: str | None
    msg_id: str
    queue_id: int
    queue_offset: int

    @property
    def ok(self) -> bool:
        return self.code == ResponseCode.SUCCESS


@dataclass(frozen=True, slots=True)
class PullReply:
    code: int
    next_offset: int
    max_offset: int
    records: list[DecodedRecord]


class _Slot:
    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: RemotingCommand | None = None


class RemotingClient:
    """One connection; create with :func:`open_client`. Methods may be called from many tasks."""

    def __init__(
        self,
        stream: trio.SocketStream,
        group: str,
        on_request: Callable[[RemotingCommand], None] | None = None,
    ) -> None:
        self._stream = stream
        self._group = group
        #: Called with each request the server sends (e.g. CHECK_TRANSACTION_STATE).
        self.on_request = on_request
        self._opaques = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._send_lock = trio.Lock()
        self._closed = False
        self._uniq_prefix = os.urandom(12).hex().upper()
        self._uniq_counter = itertools.count()

    async def request(self, command: RemotingCommand) -> RemotingCommand:
        """Send ``command`` (its opaque is assigned here) and wait for the matching response."""
        if self._closed:
            raise ConnectionLost("connection closed")
        command.opaque = opaque = next(self._opaques) & 0x7FFFFFFF
        slot = self._pending[opaque] = _Slot()
        frame = encode_command(command)
        try:
            async with self._send_lock:
                await self._stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._pending.pop(opaque, None)
            raise ConnectionLost(str(exc)) from None
        await slot.event.wait()
        if slot.response is None:
            raise ConnectionLost("connection closed before the response")
        return slot.response

    async def oneway(self, command: RemotingCommand) -> None:
        """Send ``command`` flagged oneway (its opaque is assigned here); nothing answers it."""
        command.flag |= FLAG_ONEWAY
        command.opaque = next(self._opaques) & 0x7FFFFFFF
        async with self._send_lock:
            await self._stream.send_all(encode_command(command))

    def new_uniq_key(self) -> str:
        """A 32-hex-digit ``UNIQ_KEY`` unique within this process (Java layout length, random host part)."""
        return f"{self._uniq_prefix}{next(self._uniq_counter) & 0xFFFFFFFF:08X}"

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int,
        uniq_key: str | None = None,
        tags: str = "bench",
        queue_nums: int = 4,
        properties: dict[str, str] | None = None,
    ) -> SendAck:
        """SEND_MESSAGE_V2 as a Java producer sends it (auto-creates ``topic`` with ``queue_nums``);
        ``properties`` are added to the message's own (``UNIQ_KEY``, ``WAIT``, ``TAGS``)."""
        props = {"UNIQ_KEY": uniq_key or self.new_uniq_key(), "WAIT": "true", "TAGS": tags}
        props.update(properties or {})
        command = send_message_command(
            self._group, topic, body, queue_id=queue_id, properties=props, queue_nums=queue_nums
        )
        response = await self.request(command)
        fields = response.ext_fields
        if response.code != ResponseCode.SUCCESS:
            return SendAck(response.code, response.remark, "", -1, -1)
        return SendAck(
            response.code,
            response.remark,
            fields.get("msgId", ""),
            int(fields.get("queueId", "-1")),
            int(fields.get("queueOffset", "-1")),
        )

    async def pull(
        self, topic: str, queue_id: int, offset: int, *, max_nums: int = 32, decode: bool = True
    ) -> PullReply:
        """PULL_MESSAGE without suspend (answered at once), filter ``*``; records decoded if ``decode``."""
        ext = {
            "consumerGroup": self._group,
            "topic": topic,
            "queueId": str(queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_nums),
            "sysFlag": str(PULL_FLAG_SUBSCRIPTION),
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subscription": "*",
            "subVersion": "0",
            "expressionType": "TAG",
        }
        command = RemotingCommand(code=RequestCode.PULL_MESSAGE, version=CLIENT_VERSION, ext_fields=ext)
        response = await self.request(command)
        fields = response.ext_fields
        records = decode_records(response.body) if decode and response.code == ResponseCode.SUCCESS else []
        return PullReply(
            response.code,
            int(fields.get("nextBeginOffset", str(offset))),
            int(fields.get("maxOffset", "-1")),
            records,
        )

    async def _read_loop(self) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                try:
                    data = await self._stream.receive_some(_RECEIVE_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                for command in decoder.receive_data(data):
                    if not command.is_response:
                        if self.on_request is not None:
                            self.on_request(command)
                        continue
                    slot = self._pending.pop(command.opaque, None)
                    if slot is not None:
                        slot.response = command
                        slot.event.set()
        finally:
            self._closed = True
            for slot in self._pending.values():
                slot.event.set()
            self._pending.clear()


@asynccontextmanager
async def open_client(
    port: int,
    *,
    host: str = "127.0.0.1",
    group: str = "bench",
    on_request: Callable[[RemotingCommand], None] | None = None,
) -> AsyncIterator[RemotingClient]:
    """Connect, run the response reader, and close on exit (outstanding requests get ConnectionLost).
    Requests the server sends (e.g. CHECK_TRANSACTION_STATE) go to ``on_request``."""
    stream = await trio.open_tcp_stream(host, port)
    client = RemotingClient(stream, group, on_request)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


# --- processes ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class ProxyProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (graceful drain), SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def start_proxy(
    data_dir: Path | None,
    log: Path,
    *,
    flush: str,
    port: int = 0,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    python: str = sys.executable,
    own_session: bool = False,
) -> ProxyProcess:
    """Run ``mqproxy serve`` (embedded store in ``data_dir``, JSON logs to ``log``) and wait for
    ``proxy.started``; the returned port is the bound one. Binding ``port`` retries for a few seconds
    (a just-killed proxy's port may still be held by the kernel). ``extra_env`` overrides settings (e.g.
    ``MQPROXY_BACKEND_KIND=rocketmq`` and ``MQPROXY_BACKEND_NAMESRV``: such a node takes no ``data_dir``).
    ``python`` is the interpreter that runs it (another checkout's venv for a same-run comparison).
    ``own_session``: start it in a session of its own (``setsid``), as the stock launcher starts every
    JVM: with Linux's scheduler autogroups on, a session is a CPU-share group, so the server then does not
    share one with this process and its helpers (py-spy)."""
    env = dict(os.environ, MQPROXY_STORE_FLUSH=flush, MQPROXY_STORE_BACKEND="embedded")
    env.update(extra_env or {})
    argv = [
        python,
        "-m",
        "mqproxy",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--log-format",
        "json",
        *(["--data-dir", str(data_dir)] if data_dir is not None else []),
    ]
    deadline = time.monotonic() + timeout_s
    while True:
        with log.open("ab") as out:
            start_at = out.tell()
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=own_session
            )
        while time.monotonic() < deadline:
            with log.open("rb") as f:
                f.seek(start_at)
                for line in f:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict) and event.get("event") == "proxy.started":
                        return ProxyProcess(proc, int(event["listen"].rsplit(":", 1)[1]), log)
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if time.monotonic() >= deadline:
            raise RuntimeError(f"mqproxy did not start; see {log}")
        time.sleep(0.2)  # exited early (port still busy?): try again until the deadline


class CpuMeter:
    """CPU share (1.0 = one core) of this process and of the server over a ``with`` span."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.client = self.server = 0.0

    def __enter__(self) -> CpuMeter:
        self._wall = time.perf_counter()
        self._client = time.process_time()
        self._server = cpu_seconds(self.server_pid)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.perf_counter() - self._wall, 1e-9)
        self.client = (time.process_time() - self._client) / wall
        self.server = (cpu_seconds(self.server_pid) - self._server) / wall


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_kib(pid: int) -> int:
    """Peak resident set size (VmHWM) of process ``pid``, KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1
