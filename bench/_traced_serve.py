"""Run ``python -m mqproxy ...`` with :mod:`tracemalloc` on; SIGUSR1 writes the traced bytes (after a
``gc.collect()``) as one line to the file named by ``MQBENCH_TRACE_FILE``. Used by ``bench/mqtt_idle.py``:

    python bench/_traced_serve.py -m mqproxy serve ...

With ``MQBENCH_TRACE_TOP=FILE`` each report after the first also appends the 40 largest growths since
the first, grouped by ``MQBENCH_TRACE_KEY`` (``lineno`` by default; ``traceback`` writes each group's
stack too, ``MQBENCH_TRACE_FRAMES`` deep: default 1, tracing more frames slows the server down).
"""

from __future__ import annotations

import gc
import os
import runpy
import signal
import sys
import tracemalloc
from types import FrameType

_first: list[tracemalloc.Snapshot] = []


def _report(signum: int, frame: FrameType | None) -> None:
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    with open(os.environ["MQBENCH_TRACE_FILE"], "a") as out:
        out.write(f"{current}\n")
    if os.environ.get("MQBENCH_TRACE_TOP"):  # where the growth since the first report was allocated
        snapshot = tracemalloc.take_snapshot()
        if not _first:
            _first.append(snapshot)
            return
        with open(os.environ["MQBENCH_TRACE_TOP"], "a") as out:
            key = os.environ.get("MQBENCH_TRACE_KEY", "lineno")
            for stat in snapshot.compare_to(_first[0], key)[:40]:
                out.write(f"{stat}\n")
                if key == "traceback":  # MQBENCH_TRACE_FRAMES deep, innermost last
                    out.writelines(f"    {line}\n" for line in stat.traceback.format()[::-1][:12])


def main() -> None:
    args = sys.argv[1:]
    if args[:1] != ["-m"] or len(args) < 2:
        raise SystemExit("usage: _traced_serve.py -m MODULE [ARGS...]")
    signal.signal(signal.SIGUSR1, _report)
    tracemalloc.start(int(os.environ.get("MQBENCH_TRACE_FRAMES", "1")))
    module = args[1]
    sys.argv = [module, *args[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
