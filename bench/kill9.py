"""kill -9 under load, many iterations: acknowledged messages survive, recovery is timed.

For each flush policy asked for (``--flush sync,async``) one ``mqproxy serve`` runs on the embedded store
(one data dir per policy, kept across iterations, so every restart recovers a store that has already been
killed before). Each iteration drives remoting producers (SEND_MESSAGE_V2, pipelined) and MQTT 3.1.1 QoS 1
publishers on the one port into a topic of its own, records every acknowledged message (key and the time
its acknowledgement was read), sends SIGKILL at a random moment (uniform in ``--kill-min-s``..``--kill-max-s``
after the first acknowledgement), restarts the proxy and measures:

* recovery: from spawning the new process to its ``proxy.started`` event (process start, imports, store
  recovery, listening), and the store's own ``store.recovered`` ``duration_ms``;
* lost: acknowledged messages not read back (remoting: by UNIQ_KEY; MQTT: the stored payload's key, read
  from the RocketMQ parent topic).

With ``flush=sync`` nothing acknowledged may be lost. With ``flush=async`` the documented loss window is
the last ``store.flush_interval_ms`` before the kill (a crash of the machine; a killed process alone leaves
written records in the page cache), so the check is ``lost <= acknowledged in that window``.

    python bench/kill9.py [--iterations 100] [--flush sync,async] [--seed N]

Prints one line per iteration and a summary per policy (recovery p50/p95/max ms, acked, lost, window);
exits 1 if a sync iteration lost anything or an async one lost more than its window.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kill9_load import Acked, LoadConfig, read_keys, run_load
from _remoting_client import ProxyProcess, start_proxy


@dataclass(slots=True)
class Iteration:
    number: int
    kill_after_s: float
    acked_remoting: int
    acked_mqtt: int
    attempted: int
    lost: int
    window: int  # acknowledged within flush_interval_ms before the kill
    restart_ms: float
    store_recovery_ms: float
    truncated_bytes: int


async def _drive(proxy: ProxyProcess, cfg: LoadConfig, run_id: str, kill_after: float) -> tuple[Acked, float]:
    acked = Acked()
    killed_at = 0.0

    async def killer(scope: trio.CancelScope, load_done: trio.Event) -> None:
        nonlocal killed_at
        with trio.fail_after(30):
            await acked.first_ack.wait()
        await trio.sleep(kill_after)
        killed_at = time.monotonic()
        proxy.kill9()
        with trio.move_on_after(10):
            await load_done.wait()
        scope.cancel()

    load_done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(killer, nursery.cancel_scope, load_done)
        await run_load(proxy.port, cfg, acked, run_id)
        load_done.set()
    return acked, killed_at


def _events_since(log: Path, offset: int) -> list[dict[str, object]]:
    with log.open("rb") as f:
        f.seek(offset)
        out = []
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out


def _ts(event: dict[str, object]) -> float:
    return datetime.datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def run_policy(flush: str, args: argparse.Namespace, rng: random.Random, root: Path) -> list[Iteration]:
    data_dir, log = root / flush / "data", root / flush / "proxy.log"
    data_dir.parent.mkdir(parents=True)
    env = {"MQPROXY_LOG_REQUEST_SAMPLE_RATE": "0",
           "MQPROXY_STORE_FLUSH_INTERVAL_MS": str(args.flush_interval_ms)}
    proxy = start_proxy(data_dir, log, flush=flush, extra_env=env)
    results: list[Iteration] = []
    try:
        for number in range(1, args.iterations + 1):
            run_id = f"{flush[0]}{number}"
            cfg = LoadConfig(remoting_topic=f"Kill9R{run_id}", mqtt_topic=f"k9m{run_id}/load",
                             connections=args.connections, pipeline=args.pipeline,
                             mqtt_clients=args.mqtt_clients, mqtt_window=args.mqtt_window, body=args.body)
            kill_after = rng.uniform(args.kill_min_s, args.kill_max_s)
            acked, killed_at = trio.run(_drive, proxy, cfg, run_id, kill_after)
            offset = log.stat().st_size
            spawned = time.time()
            proxy = start_proxy(data_dir, log, flush=flush, extra_env=env)
            events = _events_since(log, offset)
            started = next(e for e in events if e.get("event") == "proxy.started")
            recovered = next((e for e in events if e.get("event") == "store.recovered"), {})
            stored = trio.run(_read, proxy.port, cfg.remoting_topic, False)
            stored_mqtt = trio.run(_read, proxy.port, cfg.mqtt_topic.split("/", 1)[0], True)
            lost = len(acked.remoting.keys() - stored) + len(acked.mqtt.keys() - stored_mqtt)
            since = killed_at - args.flush_interval_ms / 1000
            window = sum(1 for t in (*acked.remoting.values(), *acked.mqtt.values()) if t >= since)
            result = Iteration(
                number, kill_after, len(acked.remoting), len(acked.mqtt), acked.attempted, lost, window,
                (_ts(started) - spawned) * 1000, float(str(recovered.get("duration_ms", "nan"))),
                int(str(recovered.get("truncated_bytes", 0))),
            )
            results.append(result)
            print(f"{flush:5} #{number:3}: killed {kill_after:.2f} s after the first ack; acked "
                  f"{result.acked_remoting} remoting + {result.acked_mqtt} mqtt of {result.attempted} sent; "
                  f"lost {lost} (window {window}); restart {result.restart_ms:.0f} ms "
                  f"(store recovery {result.store_recovery_ms:.0f} ms, {result.truncated_bytes} B truncated)",
                  flush=True)
    finally:
        proxy.stop()
    return results


async def _read(port: int, topic: str, mqtt_payload: bool) -> set[str]:
    return await read_keys(port, topic, mqtt_payload=mqtt_payload)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(flush: str, results: list[Iteration]) -> tuple[str, bool]:
    restart = [r.restart_ms for r in results]
    store = [r.store_recovery_ms for r in results]
    acked = sum(r.acked_remoting + r.acked_mqtt for r in results)
    lost = sum(r.lost for r in results)
    window = sum(r.window for r in results)
    ok = lost == 0 if flush == "sync" else all(r.lost <= r.window for r in results)
    line = (
        f"summary flush={flush}: {len(results)} kills; acked {acked} "
        f"({sum(r.acked_remoting for r in results)} remoting, {sum(r.acked_mqtt for r in results)} mqtt); "
        f"lost {lost}; acked within the last flush interval {window}; restart to ready p50 "
        f"{statistics.median(restart):.0f} / p95 {_pct(restart, 0.95):.0f} / max {max(restart):.0f} ms; "
        f"store recovery p50 {statistics.median(store):.0f} / p95 {_pct(store, 0.95):.0f} / "
        f"max {max(store):.0f} ms; {'OK' if ok else 'FAILED'}"
    )
    return line, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--flush", default="sync,async", help="comma-separated policies: sync, async")
    parser.add_argument("--flush-interval-ms", type=int, default=200, help="store.flush_interval_ms")
    parser.add_argument("--connections", type=int, default=4, help="remoting connections")
    parser.add_argument("--pipeline", type=int, default=8, help="sends outstanding per remoting connection")
    parser.add_argument("--mqtt-clients", type=int, default=4)
    parser.add_argument("--mqtt-window", type=int, default=16, help="QoS 1 publishes in flight per client")
    parser.add_argument("--body", type=int, default=128, help="message size, bytes")
    parser.add_argument("--kill-min-s", type=float, default=0.2)
    parser.add_argument("--kill-max-s", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    policies = [p for p in args.flush.split(",") if p]
    if not policies or any(p not in ("sync", "async") for p in policies) or args.iterations < 1:
        parser.error("--flush takes sync and/or async; --iterations must be >= 1")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    print(f"kill9: {args.iterations} iterations per policy {policies}, "
          f"{args.connections}x{args.pipeline} remoting + {args.mqtt_clients}x{args.mqtt_window} MQTT QoS 1, "
          f"{args.body} B, kill "
          f"{args.kill_min_s:g}-{args.kill_max_s:g} s after the first ack, flush_interval_ms "
          f"{args.flush_interval_ms}, seed {seed}, load average {os.getloadavg()[0]:.2f}", flush=True)
    lines, ok = [], True
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mqproxy-kill9-") as tmp:
        for flush in policies:
            line, good = summary(flush, run_policy(flush, args, rng, Path(tmp)))
            lines.append(line)
            ok = ok and good
    for line in lines:
        print(line)
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
