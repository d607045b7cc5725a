"""MQTT decoder cost: µs per PUBLISH (64 B payload, 14-byte topic) decoded by
:class:`~mqproxy.codecs.mqtt.MqttDecoder` from reads of 200 packets, MQTT 3.1.1 and 5, QoS 0 and 1.

``--server NAME=PYTHON`` (repeatable) runs the measurement under another checkout's interpreter, so a
"before" and "after" share the run; the servers alternate, ``--rounds`` times, and the best of each is
printed (the least disturbed by the rest of the machine).

    python bench/mqtt_codec.py [--server before=../base/.venv/bin/python --server after=.venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PACKETS_PER_READ = 200
READS = 100
CASES = ((4, 0), (4, 1), (5, 0), (5, 1))


def measure() -> dict[str, float]:
    """Best µs per packet of each case, in this interpreter."""
    from mqproxy.codecs import mqtt as mq

    out: dict[str, float] = {}
    for level, qos in CASES:
        packet = mq.encode(
            mq.Publish("bench/in/topic", bytes(64), mq.QoS(qos), packet_id=1 if qos else None), level
        )
        data = packet * PACKETS_PER_READ
        best = float("inf")
        for _ in range(5):
            decoder = mq.MqttDecoder(1 << 20, protocol_level=level)
            decoder.receive_data(mq.encode(mq.Connect("bench", protocol_level=level), level))
            started = time.perf_counter()
            for _ in range(READS):
                decoder.receive_data(data)
            best = min(best, (time.perf_counter() - started) / (READS * PACKETS_PER_READ))
        out[f"v{level} qos{qos}"] = best * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", action="append", default=[], help="NAME=PYTHON (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(measure()))
        return
    servers = [tuple(s.split("=", 1)) for s in args.server] or [("mqproxy", sys.executable)]
    best: dict[str, dict[str, float]] = {name: {} for name, _ in servers}
    for _ in range(args.rounds):
        for name, python in servers:
            got = json.loads(
                subprocess.run([python, __file__, "--inner"], check=True, capture_output=True).stdout
            )
            for case, value in got.items():
                best[name][case] = min(best[name].get(case, float("inf")), value)
    print(f"MQTT decoder, µs per PUBLISH (64 B), best of {args.rounds} rounds")
    print(f"{'server':10}" + "".join(f"{case:>11}" for case in best[servers[0][0]]))
    for name, cases in best.items():
        print(f"{name:10}" + "".join(f"{value:11.2f}" for value in cases.values()), flush=True)


if __name__ == "__main__":
    main()
