"""The one exception of the MQTT codec layer."""

from __future__ import annotations

from mqproxy.codecs.mqtt.reason_codes import ReasonCode


class MqttCodecError(Exception):
    """Bytes or a packet that break MQTT; the connection must be closed.

    `reason_code` is what to send first: in a CONNACK if the error is in the CONNECT packet, otherwise in a
    DISCONNECT -- both only to an MQTT 5 peer; a 3.1.1 peer is closed without a word (except for an
    unsupported protocol level, which 3.1.1 answers with CONNACK return code 0x01).
    """

    def __init__(self, reason_code: int, reason: str) -> None:
        super().__init__(f"{reason} (reason code 0x{reason_code:02X})")
        self.reason_code: ReasonCode = ReasonCode(reason_code)
        self.reason: str = reason


def malformed(reason: str) -> MqttCodecError:
    """An error with reason code 0x81 Malformed Packet."""
    return MqttCodecError(ReasonCode.MALFORMED_PACKET, reason)


def protocol_error(reason: str) -> MqttCodecError:
    """An error with reason code 0x82 Protocol Error."""
    return MqttCodecError(ReasonCode.PROTOCOL_ERROR, reason)
