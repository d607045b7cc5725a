"""CPU per trace record of :meth:`mqproxy.trace.TraceDispatcher.emit` at ``[trace] log_sample_rate`` 1 (the
``trace.record`` log line: JSON log chain of ``configure_logging`` into a null sink, ``conn_id`` and
``protocol`` bound) and 0 (the buffer alone, as before that event existed, plus one attribute test). A
micro-benchmark: process CPU time, best and median of ``--rounds`` rounds of ``--records`` records (Pub,
SubBefore, SubAfter in turn).

    python bench/trace_log.py [--records 30000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import structlog

from mqproxy.codecs.rocketmq_trace import PubRecord, SubAfterRecord, SubBeforeRecord, TraceRecord
from mqproxy.facade.api import BrokerFacade
from mqproxy.log import configure_logging
from mqproxy.settings import LogSettings
from mqproxy.trace import TraceDispatcher

MSG_ID = "AC11000100002A9F00000000000000AB"
REQUEST_ID = "0123456789ABCDEF0123456789ABCDEF"
RECORDS: tuple[TraceRecord, ...] = (
    PubRecord(timestamp_ms=1764331200000, group="PG", topic="Orders", msg_id=MSG_ID, keys="order-1",
              store_host="127.0.0.1:9876", body_length=100, cost_ms=1),
    SubBeforeRecord(timestamp_ms=1764331200001, group="CG", request_id=REQUEST_ID, msg_id=MSG_ID,
                    keys="order-1"),
    SubAfterRecord(request_id=REQUEST_ID, msg_id=MSG_ID, cost_ms=3, success=True, keys="order-1",
                   timestamp_ms=1764331200004, group="CG"),
)  # fmt: skip


class _NullSink:
    def write(self, data: bytes) -> None:
        pass

    def flush(self) -> None:
        pass


def _rounds(
    emit: Callable[[TraceRecord], None], dispatcher: TraceDispatcher, n: int, rounds: int
) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.process_time()
        for i in range(n):
            emit(RECORDS[i % 3])
        out.append((time.process_time() - start) / n * 1e6)
        dispatcher.buffer.take(n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    configure_logging(LogSettings(), stream=_NullSink())
    structlog.contextvars.bind_contextvars(conn_id="a1b2c3d4e5f6", protocol="remoting")
    broker = cast(BrokerFacade, None)
    logged = TraceDispatcher(broker, "RMQ_SYS_TRACE_TOPIC", 10**9, log_sample_rate=1.0)
    silent = TraceDispatcher(broker, "RMQ_SYS_TRACE_TOPIC", 10**9, log_sample_rate=0.0)
    cases: dict[str, tuple[Callable[[TraceRecord], Any], TraceDispatcher]] = {
        "emit, log_sample_rate = 1": (logged.emit, logged),
        "emit, log_sample_rate = 0": (silent.emit, silent),
    }
    for name, (emit, dispatcher) in cases.items():
        runs = _rounds(emit, dispatcher, args.records, args.rounds)
        print(
            f"{name:28} best {min(runs):5.2f} µs  median {statistics.median(runs):5.2f} µs per record (CPU)"
        )


if __name__ == "__main__":
    main()
