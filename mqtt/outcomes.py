"""
mqproxy.mqtt.outcomes
~~~~~~~~~~~~~~~~~~~~~

The values the sans-IO core (:mod:`mqproxy.mqtt.protocol`) hands its adapter: :class:`Close` (raised by a
rule that ends the connection), the checked CONNECT terms, a checked client PUBLISH and the grant of one
SUBSCRIBE filter. Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqproxy.codecs.mqtt import Properties, Publish, ReasonCode
from mqproxy.mqtt.session_record import SubscriptionSpec

__all__ = ["Close", "ConnectTerms", "Inbound", "Permission", "Subscription", "error_name", "outcome"]

#: ``can_publish(client_id, username, topic)`` / ``can_subscribe(client_id, username, topic_filter)``.
Permission = Callable[[str, "str | None", str], bool]


class Close(Exception):
    """End the connection: ``reason_code`` goes in a DISCONNECT (MQTT 5) or CONNACK (before CONNACK);
    ``error`` / ``detail`` are what ``conn.closed`` reports (None: a normal close)."""

    def __init__(self, reason_code: ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        super().__init__(error or "closed")
        self.reason_code = reason_code
        self.error = error
        self.detail = detail

    @property
    def status(self) -> str:
        """The request event's ``status`` of a request this close ended: the reason code's name, or
        ``CLOSED`` without one."""
        return self.reason_code.name if self.reason_code is not None else "CLOSED"


def error_name(code: ReasonCode) -> str:
    """The ``conn.closed`` error of a codec failure with reason ``code``."""
    return {
        ReasonCode.MALFORMED_PACKET: "malformed_packet",
        ReasonCode.PROTOCOL_ERROR: "protocol_error",
        ReasonCode.PACKET_TOO_LARGE: "packet_too_large",
    }.get(code, code.name.lower())


#: Names of the reason codes that are errors (``outcome`` runs once per request).
_ERROR_NAMES = frozenset(name for name, code in ReasonCode.__members__.items() if code.is_error)


def outcome(status: str, failed: bool) -> str:
    """A request event's ``outcome``: ``error`` if the request ``failed`` (it ended the connection) or
    its ``status`` names an error reason code, else ``ok``."""
    return "error" if failed or status in _ERROR_NAMES else "ok"


@dataclass(slots=True)
class Inbound:
    """One client PUBLISH, checked, on its way to the store and its acknowledgement."""

    packet: Publish
    topic: str
    properties: Properties
    reason: ReasonCode = ReasonCode.SUCCESS
    duplicate: bool = False
    error: str | None = None  # the store refused it

    @property
    def stored(self) -> bool:
        """True if this PUBLISH is to be written (not a QoS 2 duplicate, payload valid)."""
        return not self.duplicate and self.reason == ReasonCode.SUCCESS


@dataclass(frozen=True, slots=True)
class ConnectTerms:
    """What a CONNECT asks for, once checked: the session to open and what the CONNACK says back."""

    client_id: str
    assigned: str | None  # a client id the server chose (MQTT 5 CONNACK property)
    clean_start: bool
    expiry: int
    send_quota: int
    server_keep_alive: int | None


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE: its grant (``spec`` None: refused with ``code``)."""

    code: ReasonCode
    spec: SubscriptionSpec | None = None
    inner: str = ""  # the filter read (``$share/g/f`` → ``f``)
    shared: bool = False

    def wants_retained(self, new: bool) -> bool:
        """Whether the retained messages of the filter are sent now (Retain Handling 0, or 1 if ``new``)."""
        spec = self.spec
        return (
            spec is not None
            and not self.shared
            and (spec.retain_handling == 0 or (spec.retain_handling == 1 and new))
        )
