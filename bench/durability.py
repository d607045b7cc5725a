"""kill -9 durability check: every acknowledged send is consumed after a restart.

Each round starts ``mqproxy serve`` with the embedded store on a fresh data dir (``--flush sync`` by
default), drives a steady pipelined SEND_MESSAGE_V2 load (``--connections`` connections with
``--pipeline`` sends outstanding on each), records every acknowledged send (UNIQ_KEY, queue, offset,
msgId), sends SIGKILL to the proxy at a random moment, restarts it on the same data dir and port, pulls
every queue of the topic from offset 0 and compares:

* lost: acknowledged messages that are not read back (the figure that must be 0);
* misplaced: read back, but not at the queue/offset the acknowledgement named, or with another body;
* duplicates: a UNIQ_KEY read back more than once;
* unacked stored: messages whose send was cut by the kill but that were stored anyway (allowed).

``--flush async`` runs the same check on the default policy. A kill -9 of the process alone is expected
to lose nothing there too: the records were written to the page cache before the acknowledgement and
the OS keeps them; only a machine crash / power loss can lose the last ``store.flush_interval_ms``, which
this script does not simulate.

    python bench/durability.py [--rounds 5] [--flush sync|async] [--connections 16] [--pipeline 8]

Prints one line per round and ``lost: <n> of <acked> acknowledged``; exits 1 if anything acknowledged
was lost or misplaced.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _remoting_client import ConnectionLost, ProxyProcess, RemotingClient, open_client, start_proxy

from mqproxy.codecs.remoting_codes import ResponseCode

TOPIC = "DurabilityBench"
QUEUES = 4


@dataclass(slots=True)
class Ack:
    queue_id: int
    queue_offset: int
    msg_id: str


@dataclass(slots=True)
class RoundResult:
    acked: int
    attempted: int
    refused: int
    kill_after_s: float
    lost: int = 0
    misplaced: int = 0
    duplicates: int = 0
    unacked_stored: int = 0
    read_back: int = 0
    restart_s: float = 0.0
    examples: list[str] = field(default_factory=list)


def body_for(key: str, size: int) -> bytes:
    """A body derived from the message key, so a read-back body can be checked."""
    unit = (key + "|").encode()
    return (unit * (size // len(unit) + 1))[:size]


async def _load(
    proxy: ProxyProcess, args: argparse.Namespace, rng: random.Random
) -> tuple[dict[str, Ack], int, int, float]:
    """Send until the proxy is killed; return acknowledged sends, attempts, refusals, kill time."""
    acked: dict[str, Ack] = {}
    attempted = refused = 0
    first_ack = trio.Event()
    kill_after = rng.uniform(args.kill_min_s, args.kill_max_s)

    async def sender(client: RemotingClient, index: int) -> None:
        nonlocal attempted, refused
        seq = 0
        while True:
            key = client.new_uniq_key()
            queue_id = (index + seq) % QUEUES
            seq += 1
            attempted += 1
            try:
                ack = await client.send(TOPIC, body_for(key, args.body), queue_id=queue_id, uniq_key=key)
            except ConnectionLost:
                return
            if ack.ok:
                acked[key] = Ack(ack.queue_id, ack.queue_offset, ack.msg_id)
                first_ack.set()
            else:
                refused += 1

    async def connection(index: int) -> None:
        try:
            async with open_client(proxy.port, group="durability") as client:
                async with trio.open_nursery() as nursery:
                    for slot in range(args.pipeline):
                        nursery.start_soon(sender, client, index * args.pipeline + slot)
        except OSError:
            pass  # connect refused after the kill

    async def killer(cancel: trio.CancelScope) -> None:
        await first_ack.wait()
        await trio.sleep(kill_after)
        proxy.kill9()
        with trio.move_on_after(10):  # the senders see their connections end
            await all_done.wait()
        cancel.cancel()

    all_done = trio.Event()
    async with trio.open_nursery() as outer:
        outer.start_soon(killer, outer.cancel_scope)
        async with trio.open_nursery() as nursery:
            for index in range(args.connections):
                nursery.start_soon(connection, index)
        all_done.set()
    return acked, attempted, refused, kill_after


async def _read_back(port: int) -> list[tuple[str, int, int, bytes]]:
    """(UNIQ_KEY, queue, offset, body) of every stored message of the topic."""
    out: list[tuple[str, int, int, bytes]] = []
    async with open_client(port, group="durability-check") as client:
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                reply = await client.pull(TOPIC, queue_id, offset, max_nums=32)
                if reply.code == ResponseCode.SUCCESS:
                    for record in reply.records:
                        out.append(
                            (
                                record.properties.get("UNIQ_KEY", ""),
                                record.queue_id,
                                record.queue_offset,
                                record.body,
                            )
                        )
                    offset = reply.next_offset
                elif reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY or (
                    reply.code == ResponseCode.PULL_OFFSET_MOVED and reply.next_offset > offset
                ):
                    offset = reply.next_offset
                elif reply.code in (
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_OFFSET_MOVED,
                    ResponseCode.TOPIC_NOT_EXIST,
                ):
                    break
                else:
                    raise RuntimeError(f"pull of queue {queue_id} at {offset} failed: code {reply.code}")
    return out


def _compare(
    acked: dict[str, Ack], stored: list[tuple[str, int, int, bytes]], body_size: int, result: RoundResult
) -> None:
    counts = Counter(key for key, *_ in stored)
    where: dict[str, list[tuple[int, int, bytes]]] = {}
    for key, queue_id, offset, body in stored:
        where.setdefault(key, []).append((queue_id, offset, body))
    result.read_back = len(stored)
    result.duplicates = sum(n - 1 for n in counts.values() if n > 1)
    result.unacked_stored = sum(1 for key in counts if key not in acked)
    for key, ack in acked.items():
        found = where.get(key)
        if found is None:
            result.lost += 1
            if len(result.examples) < 5:
                result.examples.append(
                    f"lost {key} (queue {ack.queue_id} offset {ack.queue_offset} msgId {ack.msg_id})"
                )
        elif (ack.queue_id, ack.queue_offset, body_for(key, body_size)) not in found:
            result.misplaced += 1
            if len(result.examples) < 5:
                places = ", ".join(f"{q}/{o}" for q, o, _ in found)
                result.examples.append(
                    f"misplaced {key}: acked at {ack.queue_id}/{ack.queue_offset}, read at {places}"
                )


def run_round(root: Path, number: int, args: argparse.Namespace, rng: random.Random) -> RoundResult:
    data_dir = root / f"round{number}" / "data"
    log = root / f"round{number}" / "proxy.log"
    data_dir.parent.mkdir(parents=True)
    env = {"MQPROXY_LOG_REQUEST_SAMPLE_RATE": "0"}
    proxy = start_proxy(data_dir, log, flush=args.flush, extra_env=env)
    try:
        acked, attempted, refused, kill_after = trio.run(_load, proxy, args, rng)
    finally:
        if proxy.proc.poll() is None:
            proxy.kill9()
    result = RoundResult(len(acked), attempted, refused, kill_after)
    started = time.perf_counter()
    restarted = start_proxy(data_dir, log, flush=args.flush, port=proxy.port, extra_env=env)
    result.restart_s = time.perf_counter() - started
    try:
        stored = trio.run(_read_back, restarted.port)
    finally:
        restarted.stop()
    _compare(acked, stored, args.body, result)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--flush", choices=("sync", "async"), default="sync")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--pipeline", type=int, default=8, help="sends outstanding per connection")
    parser.add_argument("--body", type=int, default=256, help="body size, bytes")
    parser.add_argument(
        "--kill-min-s", type=float, default=0.5, help="kill at least this long after the first ack"
    )
    parser.add_argument(
        "--kill-max-s", type=float, default=3.0, help="kill at most this long after the first ack"
    )
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    load = os.getloadavg()
    print(
        f"durability: flush={args.flush}, {args.rounds} rounds, {args.connections} connections x "
        f"{args.pipeline} outstanding sends, {args.body} B bodies, "
        f"kill -9 {args.kill_min_s:g}-{args.kill_max_s:g} s after the first ack, seed {seed}, "
        f"load average {load[0]:.2f}",
        flush=True,
    )
    total_acked = total_lost = total_misplaced = total_dup = 0
    with tempfile.TemporaryDirectory(prefix="mqproxy-durability-") as tmp:
        for number in range(1, args.rounds + 1):
            r = run_round(Path(tmp), number, args, rng)
            print(
                f"round {number}: killed after {r.kill_after_s:.2f} s; acked {r.acked} of {r.attempted} sent "
                f"({r.refused} refused); read back {r.read_back}; lost {r.lost}; misplaced {r.misplaced}; "
                f"duplicates {r.duplicates}; unacked stored {r.unacked_stored}; restart {r.restart_s:.2f} s",
                flush=True,
            )
            for example in r.examples:
                print(f"    {example}")
            total_acked += r.acked
            total_lost += r.lost
            total_misplaced += r.misplaced
            total_dup += r.duplicates
    print(f"misplaced: {total_misplaced}; duplicates: {total_dup}")
    print(f"lost: {total_lost} of {total_acked} acknowledged")
    return 1 if total_lost or total_misplaced else 0


if __name__ == "__main__":
    sys.exit(main())
