"""The transaction check-back case of the broker-services benchmark (``bench/remoting_services.py``):
half messages left unresolved until due, every CHECK_TRANSACTION_STATE answered with a oneway commit."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import trio
from _remoting_client import CLIENT_VERSION, ConnectionLost, open_client, start_proxy
from _services_load import QUEUES, out, send_many

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode

SYSFLAG_TRANSACTION_PREPARED = 0x4
COMMIT = 8


def end_command(group: str, check: RemotingCommand) -> RemotingCommand:
    ext = check.ext_fields
    fields = {
        "producerGroup": group,
        "tranStateTableOffset": ext.get("tranStateTableOffset", "0"),
        "commitLogOffset": ext.get("commitLogOffset", "0"),
        "commitOrRollback": str(COMMIT),
        "fromTransactionCheck": "true",
        "msgId": ext.get("msgId", ""),
        "transactionId": ext.get("transactionId", ""),
    }
    return RemotingCommand(code=RequestCode.END_TRANSACTION, version=CLIENT_VERSION, ext_fields=fields)


async def check_back(args: argparse.Namespace, tmp: Path) -> None:
    env = {
        "MQPROXY_BROKER_TRANSACTION_TIMEOUT_S": "0",
        "MQPROXY_BROKER_TRANSACTION_CHECK_INTERVAL_S": "60",
    }
    proxy = start_proxy(tmp / "txn-data", tmp / "txn.log", flush="async", extra_env=env)
    group, topic = "PGTxnBench", "BTxn"
    checks: dict[str, float] = {}
    all_checked = trio.Event()
    repeated = 0
    send_end, receive_end = trio.open_memory_channel[RemotingCommand](math.inf)

    def on_request(command: RemotingCommand) -> None:
        nonlocal repeated
        if command.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        uniq = command.ext_fields.get("msgId", "")
        if uniq in checks:
            repeated += 1
        checks.setdefault(uniq, time.perf_counter())
        if len(checks) >= args.checks:
            all_checked.set()
        send_end.send_nowait(command)

    try:
        async with open_client(proxy.port, group=group, on_request=on_request) as producer:
            body = json.dumps(
                {
                    "clientID": "127.0.0.1@bench",
                    "producerDataSet": [{"groupName": group}],
                    "consumerDataSet": [],
                }
            ).encode()
            beat = await producer.request(
                RemotingCommand(code=RequestCode.HEART_BEAT, version=CLIENT_VERSION, body=body)
            )
            if beat.code != ResponseCode.SUCCESS:
                raise SystemExit(f"heartbeat refused: {beat.code} {beat.remark}")

            async def answer() -> None:
                async for command in receive_end:
                    await producer.oneway(end_command(group, command))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer)
                plain = await send_many([producer], "BTxnBaseline", args.checks)
                # every half message becomes due in the same second, after the sends (estimated from the
                # plain sends, x3): per-message CHECK_IMMUNITY_TIME_IN_SECONDS, transaction timeout 0
                due = time.perf_counter() + 3 * plain.elapsed + args.check_delay

                def half_props() -> dict[str, str]:
                    immunity = math.ceil(due - time.perf_counter())
                    return {
                        "TRAN_MSG": "true",
                        "PGROUP": group,
                        "CHECK_IMMUNITY_TIME_IN_SECONDS": str(immunity),
                    }

                halves = await send_many(
                    [producer], topic, args.checks, extra=half_props, sys_flag=SYSFLAG_TRANSACTION_PREPARED
                )
                sent_done = time.perf_counter()
                with trio.move_on_at(trio.current_time() + (due - sent_done) + 120):
                    await all_checked.wait()
                deadline = time.perf_counter() + 60
                visible = 0
                while visible < len(halves.acked_at) and time.perf_counter() < deadline:
                    visible = 0
                    for q in range(QUEUES):
                        reply = await producer.pull(topic, q, 0, max_nums=1, decode=False)
                        if reply.code == ResponseCode.SUCCESS:
                            visible += reply.max_offset
                    if visible < len(halves.acked_at):
                        await trio.sleep(0.02)
                all_visible = time.perf_counter()
                nursery.cancel_scope.cancel()
    except ConnectionLost as exc:
        raise SystemExit(f"producer connection lost: {exc}") from None
    finally:
        proxy.stop()
    times = sorted(checks.values())
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    out(
        f"txn   send plain {args.checks} msgs {args.checks / plain.elapsed:.0f} msgs/s;"
        f" send half {args.checks} msgs {args.checks / halves.elapsed:.0f} msgs/s"
    )
    out(
        f"txn   check-back {len(checks)} checks in {span:.2f} s {len(checks) / span:.0f} checks/s"
        f"  first {times[0] - due:+.2f} s last {times[-1] - due:+.2f} s from the due time"
        f"  repeated {repeated}  all {visible} committed visible {all_visible - due:+.2f} s"
        f"  (sends ended {sent_done - due:+.2f} s)"
    )
    if len(checks) != args.checks or visible != args.checks:
        raise SystemExit(f"txn: {len(checks)} checked, {visible} committed of {args.checks}")
