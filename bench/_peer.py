"""A baseline peer for the benchmarks: a trio TCP server in a child process, on a free loopback port."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["start_peer"]

_SERVE = """
async def main():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(handler, listeners)

trio.run(main)
"""


def start_peer(handler_source: str) -> tuple[subprocess.Popen[bytes], int]:
    """Run ``handler_source`` (Python that imports trio and defines ``async def handler(stream)``) as a
    server in a child process; returns the process and its port. Exits if the server does not start."""
    proc = subprocess.Popen([sys.executable, "-c", handler_source + _SERVE], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("baseline peer did not start")
    return proc, int(line)
