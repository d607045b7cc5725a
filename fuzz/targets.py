"""
mqproxy.fuzz.targets
~~~~~~~~~~~~~~~~~~~~

The route table of fuzz targets: name -> :class:`Target` (what it runs, the errors its contract allows,
its seed corpus). A target's ``run(data, split)`` is a pure function of its input: ``split`` cuts the bytes
into two ``receive_data`` calls for the streaming decoders (0: one call); the sniffer reads its low six bits
as the set of allowed protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from mqproxy.fuzz import grpc_target, mqtt_target, remoting_target, wire_target
from mqproxy.fuzz.mutator import Seed

__all__ = ["TARGETS", "Target"]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    #: What one input exercises (shown in reports).
    covers: str
    run: Callable[[bytes, int], None]
    #: The exceptions the codec documents; anything else raised by ``run`` is a finding.
    errors: tuple[type[BaseException], ...]
    seeds: Callable[[], list[Seed]]
    max_len: int = 4096


TARGETS: Mapping[str, Target] = MappingProxyType({t.name: t for t in (
    Target("remoting", "remoting frames, JSON + ROCKETMQ headers, typed headers, properties, bodies",
           remoting_target.run, remoting_target.ERRORS, remoting_target.seeds),
    Target("mqtt311", "MQTT 3.1.1 decoder, every packet type, round trip",
           mqtt_target.decoder_run(4), mqtt_target.DECODER_ERRORS, lambda: mqtt_target.decoder_seeds(4)),
    Target("mqtt5", "MQTT 5.0 decoder, every packet type and property, round trip",
           mqtt_target.decoder_run(5), mqtt_target.DECODER_ERRORS, lambda: mqtt_target.decoder_seeds(5)),
    Target("mqtt_session", "MQTT server connection core (3.1, 3.1.1, 5.0): CONNECT, PUBLISH, SUBSCRIBE...",
           mqtt_target.session_run, mqtt_target.SESSION_ERRORS, mqtt_target.session_seeds),
    Target("h2", "gRPC over h2: preface, frames, HPACK, request validation, message framing, responses",
           grpc_target.h2_run, grpc_target.H2_ERRORS, grpc_target.h2_seeds),
    Target("protobuf", "RocketMQ v2 request messages + TelemetryCommand, SendMessage conversion",
           grpc_target.protobuf_run, grpc_target.PROTOBUF_ERRORS, grpc_target.protobuf_seeds),
    Target("proxy", "PROXY protocol v1 and v2 headers (TLVs, CRC32C), grown prefixes",
           wire_target.proxy_run, wire_target.PROXY_ERRORS, wire_target.proxy_seeds, max_len=512),
    Target("sniff", "protocol sniffer over every allowed-protocol subset",
           wire_target.sniff_run, wire_target.SNIFF_ERRORS, wire_target.sniff_seeds, max_len=160),
)})
