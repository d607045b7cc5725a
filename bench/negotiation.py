"""Negotiation benchmark: connections accepted → sniffed → closed per second, and sniff latency, per protocol.

Runs mqproxy (memory backend, JSON logs to a file) and, as the baseline, a plain trio echo server, each
in its own process, and drives both from this process with the same connection pattern: connect, send
the protocol's first bytes, read the first answer (route, CONNACK, SETTINGS, HTTP response), then for
HTTP ("Connection: close") wait for the server to close, and for the long-lived protocols close at once.
Sniff latency is the proxy's own ``sniff_ms`` from ``conn.negotiated`` events.

    python bench/negotiation.py [--connections 2000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h2.config
import h2.connection
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import percentile
from _peer import start_peer

from mqproxy.codecs.mqtt import Connect, encode
from mqproxy.codecs.remoting import RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode

ECHO_SERVER = """
import sys, trio
async def handler(stream):
    try:
        data = await stream.receive_some(65536)
        if data:
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass
"""


def _remoting_route_request() -> bytes:
    command = RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC, version=401, opaque=1, ext_fields={"topic": "BenchTopic"}
    )
    return encode_command(command)


def _grpc_preface() -> bytes:
    """The client connection preface and first SETTINGS of an h2c gRPC client."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return conn.data_to_send()


def _proxy_v1(inner: bytes) -> bytes:
    return b"PROXY TCP4 203.0.113.1 127.0.0.1 50000 9876\r\n" + inner


HTTP_GET = b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
PAYLOADS: dict[str, bytes] = {
    "remoting": _remoting_route_request(),
    "mqtt": encode(Connect("dev1", keep_alive=60), 4),
    "grpc": _grpc_preface(),
    "http": HTTP_GET,
    "proxy+http": _proxy_v1(HTTP_GET),
}


async def _one(port: int, payload: bytes, tls: ssl.SSLContext | None) -> float:
    started = time.perf_counter()
    stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
    if tls is not None:
        stream = trio.SSLStream(stream, tls, server_hostname="localhost")
    try:
        await stream.send_all(payload)
        first = await stream.receive_some(65536)
        latency = time.perf_counter() - started
        if first and payload.endswith(HTTP_GET):
            # HTTP with "Connection: close": the server ends the connection, wait for that. Remoting,
            # MQTT and gRPC connections are long-lived: the client closes after the first answer.
            with trio.move_on_after(5):
                try:
                    while await stream.receive_some(65536):
                        pass
                except trio.BrokenResourceError:
                    pass
    finally:
        await trio.aclose_forcefully(stream)
    return latency


async def _drive(
    port: int, payload: bytes, n: int, concurrency: int, tls: ssl.SSLContext | None = None
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    remaining = iter(range(n))

    async def worker() -> None:
        for _ in remaining:
            latencies.append(await _one(port, payload, tls))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return n / (time.perf_counter() - started), latencies


def _start_proxy(workdir: Path, cert: tuple[str, str] | None) -> tuple[subprocess.Popen[bytes], int, Path]:
    log = workdir / "proxy.log"
    env = dict(os.environ, MQPROXY_STORE_BACKEND="memory", MQPROXY_SERVER_SNIFF_TIMEOUT_S="5")
    if cert:
        env.update(MQPROXY_TLS_CERT_FILE=cert[0], MQPROXY_TLS_KEY_FILE=cert[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqproxy", "serve", "--listen", "127.0.0.1:0", "--log-format", "json"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "proxy.started":
                return proc, int(event["listen"].rsplit(":", 1)[1]), log
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"mqproxy did not start:\n{log.read_text()}")


def _sniff_ms_by_protocol(log: Path) -> dict[tuple[str, bool], list[float]]:
    out: dict[tuple[str, bool], list[float]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "conn.negotiated":
            key = (event["protocol"] + ("+proxy" if event["proxied"] else ""), event["tls"])
            out.setdefault(key, []).append(event["sniff_ms"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    import trustme

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        ca = trustme.CA()
        issued = ca.issue_cert("localhost")
        cert, key = workdir / "cert.pem", workdir / "key.pem"
        issued.private_key_and_cert_chain_pem.write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        client_tls = ssl.create_default_context()
        ca.configure_trust(client_tls)

        proxy, proxy_port, log = _start_proxy(workdir, (str(cert), str(key)))
        echo, echo_port = start_peer(ECHO_SERVER)
        rows = []
        try:
            rate, lat = trio.run(_drive, echo_port, HTTP_GET, args.connections, args.concurrency)
            rows.append(
                (
                    "baseline: trio echo",
                    "-",
                    rate,
                    percentile(lat, 50) * 1e3,
                    percentile(lat, 99) * 1e3,
                    None,
                    None,
                )
            )
            cases: list[tuple[str, bytes, ssl.SSLContext | None]] = [
                (name, payload, None) for name, payload in PAYLOADS.items()
            ]
            cases.append(("tls+http", HTTP_GET, client_tls))
            for name, payload, tls in cases:
                n = args.connections if tls is None else max(200, args.connections // 5)
                rate, lat = trio.run(_drive, proxy_port, payload, n, args.concurrency, tls)
                rows.append(
                    (
                        f"mqproxy: {name}",
                        n,
                        rate,
                        percentile(lat, 50) * 1e3,
                        percentile(lat, 99) * 1e3,
                        None,
                        None,
                    )
                )
        finally:
            proxy.terminate()
            proxy.wait(20)
            echo.kill()
        sniff = _sniff_ms_by_protocol(log)

    print(
        f"negotiation benchmark: {args.connections} connections per case, concurrency {args.concurrency}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(f"{'case':28} {'conns/s':>10} {'first-answer p50 ms':>20} {'p99 ms':>9}")
    for name, _n, rate, p50, p99, _a, _b in rows:
        print(f"{name:28} {rate:10.0f} {p50:20.2f} {p99:9.2f}")
    print()
    print(f"{'sniff latency (server side)':28} {'count':>10} {'p50 ms':>20} {'p99 ms':>9}")
    for (proto, over_tls), values in sorted(sniff.items()):
        label = f"{proto}{' (tls)' if over_tls else ''}"
        print(f"{label:28} {len(values):10d} {percentile(values, 50):20.3f} {percentile(values, 99):9.3f}")


if __name__ == "__main__":
    main()
