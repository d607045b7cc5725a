"""Per-PUBLISH decode and encode cost (QoS 0/1, 100-byte payload, 3.1.1 and 5.0). Run with `-m slow -s`."""

from __future__ import annotations

import time
import timeit

import pytest

from mqproxy.codecs.mqtt import MqttDecoder, Publish, QoS, encode

ROUNDS = 20_000


def _per_call_us(function: object) -> float:
    timings = timeit.repeat(function, number=ROUNDS, repeat=5, timer=time.process_time)  # type: ignore[arg-type]
    return min(timings) / ROUNDS * 1e6


@pytest.mark.slow
@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [QoS.AT_MOST_ONCE, QoS.AT_LEAST_ONCE])
def test_publish_codec_cost(level: int, qos: QoS) -> None:
    packet = Publish("sensors/room1/temperature", b"x" * 100, qos, packet_id=7 if qos else None)
    raw = encode(packet, level)
    decoder = MqttDecoder(1 << 20, protocol_level=level)
    assert decoder.receive_data(raw) == [packet]
    decode_us = _per_call_us(lambda: decoder.receive_data(raw))
    encode_us = _per_call_us(lambda: encode(packet, level))
    print(
        f"\nMQTT level {level} QoS {int(qos)} PUBLISH ({len(raw)} B): decode {decode_us:.2f} us, "
        f"encode {encode_us:.2f} us"
    )
    assert decode_us < 100  # a loose ceiling that still catches an accidental quadratic path
    assert encode_us < 100
