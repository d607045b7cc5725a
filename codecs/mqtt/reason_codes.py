"""MQTT 5.0 reason codes, MQTT 3.1.1 CONNACK return codes, and the packet types each code may appear in.

Packets carry MQTT 5 reason codes whatever the protocol level; the codec translates them to and from the
3.1.1 CONNACK and SUBACK return codes (`connack_return_code`, `reason_from_connack_return_code`).
"""

from __future__ import annotations

from enum import IntEnum


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes (section 2.4). Some values have several names, as in the specification."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

    @property
    def is_error(self) -> bool:
        """True for failure codes (0x80 and above)."""
        return self >= 0x80


class ConnackReturnCode(IntEnum):
    """MQTT 3.1.1 CONNACK return codes (section 3.2.2.3)."""

    ACCEPTED = 0x00
    UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    IDENTIFIER_REJECTED = 0x02
    SERVER_UNAVAILABLE = 0x03
    BAD_USER_NAME_OR_PASSWORD = 0x04
    NOT_AUTHORIZED = 0x05


def _codes(*values: int) -> frozenset[ReasonCode]:
    return frozenset(ReasonCode(v) for v in values)


CONNACK_REASON_CODES = _codes(
    0x00,
    0x80,
    0x81,
    0x82,
    0x83,
    0x84,
    0x85,
    0x86,
    0x87,
    0x88,
    0x89,
    0x8A,
    0x8C,
    0x90,
    0x95,
    0x97,
    0x99,
    0x9A,
    0x9B,
    0x9C,
    0x9D,
    0x9F,
)
"""Reason codes a CONNACK may carry (MQTT 5.0 section 3.2.2.2)."""

PUBACK_REASON_CODES = _codes(0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)
"""Reason codes a PUBACK or PUBREC may carry."""

PUBREL_REASON_CODES = _codes(0x00, 0x92)
"""Reason codes a PUBREL or PUBCOMP may carry."""

SUBACK_REASON_CODES = _codes(0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)
"""Reason codes a SUBACK may carry, one per topic filter."""

UNSUBACK_REASON_CODES = _codes(0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)
"""Reason codes an UNSUBACK may carry, one per topic filter."""

DISCONNECT_REASON_CODES = _codes(
    0x00,
    0x04,
    0x80,
    0x81,
    0x82,
    0x83,
    0x87,
    0x89,
    0x8B,
    0x8D,
    0x8E,
    0x8F,
    0x90,
    0x93,
    0x94,
    0x95,
    0x96,
    0x97,
    0x98,
    0x99,
    0x9A,
    0x9B,
    0x9C,
    0x9D,
    0x9E,
    0x9F,
    0xA0,
    0xA1,
    0xA2,
)
"""Reason codes a DISCONNECT may carry."""

AUTH_REASON_CODES = _codes(0x00, 0x18, 0x19)
"""Reason codes an AUTH may carry."""

_R = ReasonCode

_CONNACK_V311: dict[ReasonCode, ConnackReturnCode] = {
    _R.SUCCESS: ConnackReturnCode.ACCEPTED,
    _R.UNSUPPORTED_PROTOCOL_VERSION: ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
    _R.CLIENT_IDENTIFIER_NOT_VALID: ConnackReturnCode.IDENTIFIER_REJECTED,
    _R.SERVER_UNAVAILABLE: ConnackReturnCode.SERVER_UNAVAILABLE,
    _R.BAD_USER_NAME_OR_PASSWORD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
    _R.NOT_AUTHORIZED: ConnackReturnCode.NOT_AUTHORIZED,
    _R.BANNED: ConnackReturnCode.NOT_AUTHORIZED,
    _R.BAD_AUTHENTICATION_METHOD: ConnackReturnCode.NOT_AUTHORIZED,
}
_V311_CONNACK: dict[ConnackReturnCode, ReasonCode] = {
    ConnackReturnCode.ACCEPTED: _R.SUCCESS,
    ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION: _R.UNSUPPORTED_PROTOCOL_VERSION,
    ConnackReturnCode.IDENTIFIER_REJECTED: _R.CLIENT_IDENTIFIER_NOT_VALID,
    ConnackReturnCode.SERVER_UNAVAILABLE: _R.SERVER_UNAVAILABLE,
    ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD: _R.BAD_USER_NAME_OR_PASSWORD,
    ConnackReturnCode.NOT_AUTHORIZED: _R.NOT_AUTHORIZED,
}


def connack_return_code(reason_code: ReasonCode) -> ConnackReturnCode:
    """The 3.1.1 CONNACK return code for an MQTT 5 reason code.

    Codes 3.1.1 has no equivalent for (server busy, quota, malformed packet, ...) become SERVER_UNAVAILABLE,
    the only refusal that tells the client to retry later.
    """
    return _CONNACK_V311.get(reason_code, ConnackReturnCode.SERVER_UNAVAILABLE)


def reason_from_connack_return_code(code: ConnackReturnCode) -> ReasonCode:
    """The MQTT 5 reason code for a 3.1.1 CONNACK return code."""
    return _V311_CONNACK[code]
