"""The mapping between MQTT topics and RocketMQ topics / light message queues (LMQ).

Contracts (documented for users in the module text; stable across restarts because LMQ names are
stored):

* **Parent topic.** A PUBLISH to ``a/b/c`` is stored once in the RocketMQ topic ``a`` (its first level),
  so RocketMQ consumers of ``a`` read every MQTT message of the ``a/...`` tree. A first level that is not a
  legal RocketMQ topic (empty, ``$SYS``, characters outside ``[A-Za-z0-9_|-]``, longer than 64 bytes, or a
  reserved name) maps to :data:`FALLBACK_PARENT_TOPIC`.
* **LMQ names.** Every topic name and every wildcard filter has its own LMQ ``%LMQ%<escaped>``:
  ``A-Z a-z 0-9 _ -`` stay, ``/`` becomes ``%`` (as in rocketmq-mqtt), and every other UTF-8 byte becomes
  ``|`` plus two upper-case hex digits (``+`` → ``|2B``, ``#`` → ``|23``, ``$`` → ``|24``). A name longer
  than 127 bytes is cut and ends with ``|H`` plus a 32-hex-digit BLAKE2b digest of the full escaped name.
  ``|`` followed by a non-hex letter never comes out of escaping, so the internal queues below never
  collide with a topic. A filter without wildcards is served by its topic's LMQ.
* **Properties.** The stored message carries :data:`PROPERTY_MQTT_TOPIC` (the full MQTT topic),
  :data:`PROPERTY_MQTT_QOS`, :data:`PROPERTY_MQTT_CLIENT` (publisher, for no-local), ``MQTT_RETAIN`` when
  the publish had RETAIN set, and :data:`PROPERTY_MQTT5` (JSON of the MQTT 5 publish properties: user
  properties, content type, payload format, response topic, correlation data, message expiry).
  User properties are also copied as plain message properties when their key is a safe identifier that
  does not shadow a RocketMQ system property, so RocketMQ consumers see them.
* **RocketMQ → MQTT.** A RocketMQ producer reaches MQTT subscribers of ``a/b/c`` by sending to topic
  ``a`` with property ``MQTT_TOPIC=a/b/c`` and ``INNER_MULTI_DISPATCH`` naming ``lmq_for("a/b/c")`` (and
  the LMQs of wildcard filters it wants to reach); a protocol handler that sees ``MQTT_TOPIC`` without a
  dispatch list can compute it with :meth:`mqproxy.mqtt.publishing.Publisher.rocketmq_dispatch`. Such
  messages are delivered at QoS ``min(MQTT_QOS or 1, subscription QoS)``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from mqproxy.codecs.mqtt import NO_PROPERTIES, Properties
from mqproxy.model.topics import LMQ_PREFIX, MAX_TOPIC_BYTES, SEND_FORBIDDEN_TOPICS

PROPERTY_MQTT_TOPIC = "MQTT_TOPIC"
PROPERTY_MQTT_QOS = "MQTT_QOS"
PROPERTY_MQTT_CLIENT = "MQTT_CLIENT_ID"
PROPERTY_MQTT_RETAIN = "MQTT_RETAIN"
PROPERTY_MQTT5 = "MQTT5_PROPS"

#: Parent topic of MQTT topics whose first level is not a legal RocketMQ topic name.
FALLBACK_PARENT_TOPIC = "MQTT_OTHER"
#: Internal topic holding persistent-session snapshots (one JSON record per change).
SESSION_STATE_TOPIC = "MQTT_SESSION_STATE"
#: Internal LMQ indexing every retained publish (the last record per MQTT topic is the retained value).
RETAINED_LMQ = LMQ_PREFIX + "|RETAINED"
#: Consumer-group prefix of a session's LMQ offsets: ``%MQTT%<client id>``.
SESSION_GROUP_PREFIX = "%MQTT%"
SHARED_GROUP_PREFIX = "%MQTT_SHARE%"

_PARENT_OK = re.compile(r"[A-Za-z0-9_|-]{1,64}")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SAFE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_RESERVED_KEYS = frozenset(
    {
        "TAGS",
        "KEYS",
        "UNIQ_KEY",
        "DELAY",
        "WAIT",
        "TRAN_MSG",
        "PGROUP",
        "MAX_OFFSET",
        "MIN_OFFSET",
        "REAL_TOPIC",
        "REAL_QID",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "MSG_REGION",
        "TRACE_ON",
        "INNER_MULTI_DISPATCH",
        "INNER_MULTI_QUEUE_OFFSET",
        PROPERTY_MQTT_TOPIC,
        PROPERTY_MQTT_QOS,
        PROPERTY_MQTT_CLIENT,
        PROPERTY_MQTT_RETAIN,
        PROPERTY_MQTT5,
    }
)
_HEX = "0123456789ABCDEF"
_ESCAPES = {
    b: (chr(b) if b in _SAFE else "%" if b == 0x2F else "|" + _HEX[b >> 4] + _HEX[b & 15]) for b in range(256)
}


@functools.lru_cache(maxsize=65536)
def parent_topic(mqtt_topic: str) -> str:
    """The RocketMQ topic an MQTT topic's messages are stored in (its first level, or the fallback)."""
    first = mqtt_topic.partition("/")[0]
    if (
        _PARENT_OK.fullmatch(first) is None
        or first in SEND_FORBIDDEN_TOPICS
        or first.startswith("rmq_sys_")
        or first == SESSION_STATE_TOPIC
    ):
        return FALLBACK_PARENT_TOPIC
    return first


@functools.lru_cache(maxsize=65536)
def lmq_name(topic_or_filter: str) -> str:
    """The LMQ of an MQTT topic name or (wildcard) filter; see the module docstring for the escaping."""
    escaped = "".join([_ESCAPES[b] for b in topic_or_filter.encode()])
    name = LMQ_PREFIX + escaped
    if len(name) <= MAX_TOPIC_BYTES:
        return name
    digest = hashlib.blake2b(escaped.encode(), digest_size=16).hexdigest()
    return name[: MAX_TOPIC_BYTES - 34] + "|H" + digest


@dataclass(frozen=True, slots=True)
class MqttAttributes:
    """What the MQTT side needs back from a stored message."""

    topic: str
    qos: int
    client_id: str
    retain: bool
    properties: Properties


def encode_properties(
    topic: str, qos: int, client_id: str, retain: bool, props: Properties
) -> dict[str, str]:
    """Message properties for an MQTT publish (see the module docstring)."""
    out = {PROPERTY_MQTT_TOPIC: topic, PROPERTY_MQTT_QOS: str(qos), PROPERTY_MQTT_CLIENT: client_id}
    if retain:
        out[PROPERTY_MQTT_RETAIN] = "1"
    v5: dict[str, object] = {}
    if props.user_properties:
        v5["up"] = [list(pair) for pair in props.user_properties]
        for key, value in props.user_properties:
            if (
                _SAFE_KEY.fullmatch(key)
                and key not in _RESERVED_KEYS
                and "\x01" not in value
                and "\x02" not in value
            ):
                out.setdefault(key, value)
    if props.content_type is not None:
        v5["ct"] = props.content_type
    if props.payload_format_indicator is not None:
        v5["pf"] = props.payload_format_indicator
    if props.response_topic is not None:
        v5["rt"] = props.response_topic
    if props.correlation_data is not None:
        v5["cd"] = base64.b64encode(props.correlation_data).decode()
    if props.message_expiry_interval is not None:
        v5["me"] = props.message_expiry_interval
    if v5:
        out[PROPERTY_MQTT5] = json.dumps(v5, separators=(",", ":"))
    return out


#: Decoded attributes of messages without MQTT 5 properties, by (topic, QoS, client id, retain, default
#: QoS) as stored: a fan-in's messages repeat a few such combinations (the values are immutable, so they
#: are shared). Emptied when full.
_DECODED: dict[tuple[str, str | None, str, str | None, int], MqttAttributes] = {}
_DECODED_MAX = 4096


def decode_properties(properties: Mapping[str, str], default_qos: int = 1) -> MqttAttributes | None:
    """The MQTT view of a stored message; None if it has no MQTT topic (not meant for MQTT). Equal
    properties give equal (possibly the same, immutable) attributes."""
    topic = properties.get(PROPERTY_MQTT_TOPIC)
    if not topic:
        return None
    if PROPERTY_MQTT5 not in properties:
        key = (
            topic,
            properties.get(PROPERTY_MQTT_QOS),
            properties.get(PROPERTY_MQTT_CLIENT, ""),
            properties.get(PROPERTY_MQTT_RETAIN),
            default_qos,
        )
        found = _DECODED.get(key)
        if found is None:
            found = _decode(properties, topic, default_qos)
            if len(_DECODED) >= _DECODED_MAX:
                _DECODED.clear()
            _DECODED[key] = found
        return found
    return _decode(properties, topic, default_qos)


def _decode(properties: Mapping[str, str], topic: str, default_qos: int) -> MqttAttributes:
    try:
        qos = min(max(int(properties.get(PROPERTY_MQTT_QOS, default_qos)), 0), 2)
    except ValueError:
        qos = default_qos
    props = NO_PROPERTIES
    raw = properties.get(PROPERTY_MQTT5)
    if raw:
        try:
            v5 = json.loads(raw)
            props = Properties(
                user_properties=tuple((str(k), str(v)) for k, v in v5.get("up", ())),
                content_type=v5.get("ct"),
                payload_format_indicator=v5.get("pf"),
                response_topic=v5.get("rt"),
                correlation_data=base64.b64decode(v5["cd"]) if "cd" in v5 else None,
                message_expiry_interval=v5.get("me"),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            props = NO_PROPERTIES  # a foreign producer's malformed JSON: deliver without v5 extras
    return MqttAttributes(
        topic=topic,
        qos=qos,
        client_id=properties.get(PROPERTY_MQTT_CLIENT, ""),
        retain=properties.get(PROPERTY_MQTT_RETAIN) == "1",
        properties=props,
    )
