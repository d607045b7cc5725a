"""CPU per request of reporting the request events of one read's run of MQTT PUBLISHes, in process.

Two paths of the same server recorder, JSON log through the buffered sink to a rotating file in a
temporary directory (removed at the end; 8 MiB per file):

* ``per-request``: one event dict per request, ``ConnectionContext.request_events`` →
  ``ServerRecorder.record_run`` (one ``request`` line per request; what the MQTT layer did up to round 5);
* ``run``: ``ConnectionContext.request_run`` → ``ServerRecorder.record_batch`` (one ``request.run`` line
  per run, a ``request`` for a run of one; round 6).

Each figure is the best of 5 repetitions of process CPU time per request (µs), for runs of 1 to 64.

    python bench/request_events.py
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from mqproxy.context import ServerRecorder, ServerState
from mqproxy.log import configure_logging
from mqproxy.runtime.context import ConnectionContext
from mqproxy.settings import LogSettings, Settings

TOPIC = "bench/fan-in/0"
RUN_LENGTHS = (1, 2, 4, 8, 16, 32, 64)


def _context() -> ConnectionContext:
    state = ServerState(settings=Settings.for_tests(), backend_name="memory")
    ctx = ConnectionContext("c1", ("127.0.0.1", 1), ("127.0.0.1", 2), recorder=ServerRecorder(state))
    ctx.protocol = "mqtt"
    return ctx


def _per_request(ctx: ConnectionContext) -> Callable[[int], None]:
    def report(n: int) -> None:
        ctx.request_events(
            [
                {
                    "op": "PUBLISH",
                    "code": 3,
                    "status": "SUCCESS",
                    "outcome": "ok",
                    "latency_ms": 0.123,
                    "client_id": "pub-0001",
                    "topic": TOPIC,
                }
                for _ in range(n)
            ]
        )

    return report


def _run(ctx: ConnectionContext) -> Callable[[int], None]:
    def report(n: int) -> None:
        shared = {"op": "PUBLISH", "code": 3, "latency_ms": 0.123, "client_id": "pub-0001"}
        ctx.request_run(shared, ["SUCCESS"] * n, ["ok"] * n, [TOPIC] * n)

    return report


def _us_per_request(report: Callable[[int], None], n: int) -> float:
    reps = max(1000, 20_000 // n)
    for _ in range(100):
        report(n)
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(reps):
            report(n)
        best = min(best, (time.process_time() - start) / (reps * n) * 1e6)
    return best


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mqproxy-request-events-") as tmp:
        _measure(Path(tmp) / "bench.log")


def _measure(log_file: Path) -> None:
    sink = configure_logging(LogSettings(file=str(log_file), rotate_bytes=8 << 20), cache=True)
    structlog.contextvars.bind_contextvars(conn_id="c000001", protocol="mqtt")
    try:
        ctx = _context()
        print("request events of one run, CPU per request (best of 5):")
        for n in RUN_LENGTHS:
            before = _us_per_request(_per_request(ctx), n)
            after = _us_per_request(_run(ctx), n)
            print(
                f"  run of {n:2d}: per-request {before:5.2f} us  run {after:5.2f} us  ({after / before:.2f}x)"
            )
    finally:
        sink.close()


if __name__ == "__main__":
    main()
