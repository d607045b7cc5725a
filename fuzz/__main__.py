"""``python -m mqproxy.fuzz [--inputs N] [--workers 2] [--seed 1] [--targets remoting,mqtt5,...]``

Prints one line per target (inputs, inputs/s per core, slowest input, bytes retained by the leak window)
and every finding with its minimised input; exits 1 if there is any finding.
"""

from __future__ import annotations

import argparse
import os
import sys

from mqproxy.fuzz.runner import FuzzSettings, RssTracker, fuzz
from mqproxy.fuzz.targets import TARGETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqproxy.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=int(os.environ.get("MQFUZZ_INPUTS", 1_000_000)),
                        help="inputs per target (env MQFUZZ_INPUTS; default 1000000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, of {', '.join(TARGETS)}")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown or args.inputs < 1 or args.workers < 1:
        parser.error(f"unknown targets {unknown}" if unknown else "--inputs and --workers must be >= 1")
    settings = FuzzSettings(inputs=args.inputs, workers=args.workers, seed=args.seed)
    rss = RssTracker()
    reports, wall = fuzz(names, settings, rss)
    total = 0
    for r in reports:
        total += r.inputs
        print(f"{r.target:13} {r.inputs:>9} inputs  {r.per_core_rate:>8.0f}/s per core  "
              f"busy {r.busy_s:6.1f} s  slowest {r.max_input_ms:6.1f} ms  "
              f"retained {r.max_retained_bytes:>6} B  "
              f"findings {len(r.findings)}")
    print(f"total: {total} inputs in {wall:.1f} s wall ({total / wall:.0f}/s with {args.workers} workers); "
          f"worker RSS growth after the first chunk {rss.growth_kib} KiB")
    findings = [f for r in reports for f in r.findings]
    for f in findings:
        print(f"FINDING {f.target} {f.kind}: {f.key} {f.detail}\n    input {f.data.hex()} split {f.split}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
