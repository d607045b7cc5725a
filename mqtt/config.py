"""Limits and defaults of the MQTT gateway; the server builds one from the ``[mqtt]`` settings section
(:func:`mqproxy.mqtt.gateway.config_from_settings`)."""

from __future__ import annotations

from dataclasses import dataclass

#: A Session Expiry Interval that never ends (MQTT 5; a 3.1.1 session without clean session).
NEVER_EXPIRES = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class MqttConfig:
    #: Largest packet accepted from a client (CONNACK Maximum Packet Size in MQTT 5).
    max_packet_size: int = 1024 * 1024
    #: Un-acked QoS 1/2 PUBLISHes the server accepts from a client (CONNACK Receive Maximum).
    receive_maximum: int = 64
    #: Un-acked QoS 1/2 PUBLISHes sent to a 3.1.1 client.
    default_send_quota: int = 64
    #: Cap on an MQTT 5 client's Receive Maximum (bounds in-flight memory per session).
    max_send_quota: int = 1024
    maximum_qos: int = 2
    topic_alias_maximum: int = 16
    #: Longest keep alive accepted: an MQTT 5 client asking for more (or 0) gets this as Server Keep Alive.
    max_keep_alive: int | None = None
    connect_timeout_s: float = 10.0
    #: A client that has not taken written bytes for this long is disconnected (slow consumer).
    write_timeout_s: float = 30.0
    #: Outgoing packets buffered per connection before delivery waits (the LMQ keeps the rest).
    send_buffer_packets: int = 1024
    pull_batch: int = 32
    #: Bounds of the read cache shared by all subscription readers (0 disables it; see :mod:`.read_cache`).
    read_cache_segments: int = 4096
    read_cache_bytes: int = 64 * 1024 * 1024
    #: Longest single long-poll on an LMQ before re-checking.
    poll_interval_s: float = 30.0
    #: Dead records (replaced or cleared retained values, superseded session snapshots) a state log must
    #: hold, and outnumber its live ones, before it is compacted (at start-up and by the housekeeping timer).
    compaction_min_records: int = 10_000
    #: Topic filters refused at SUBSCRIBE (reason 0x87 Not authorized; 0x80 in 3.1.1).
    deny_subscribe: tuple[str, ...] = ()
