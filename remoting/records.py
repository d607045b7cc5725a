"""
mqproxy.remoting.records
~~~~~~~~~~~~~~~~~~~~~~~~

Stored messages as the records remoting answers carry (pull, pop, peek, query, view, CHECK_TRANSACTION_STATE,
CONSUME_MESSAGE_DIRECTLY), with the one event their encoding can give: ``remoting.properties_dropped`` when a
message's properties do not fit a record's 2-byte PROPERTIESLEN and some were left out
(:func:`mqproxy.codecs.message_record.fit_properties`). The message itself still goes out, body, topic and
the keys clients act on included, and so do the other messages of the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

from mqproxy.codecs.message_record import DroppedProperties, OnDropped, encode_records
from mqproxy.model.types import PROPERTY_UNIQ_KEY, StoredMessage

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession

__all__ = ["dropped_logger", "records_body"]

_log = structlog.get_logger("mqproxy.remoting")
#: Each dropped key is logged cut to this many characters (a key may itself be what is too long).
_KEY_CHARS = 64


def dropped_logger(op: str, client_id: str | None = None, log: Any = None) -> OnDropped:
    """An ``on_dropped`` callback that logs ``remoting.properties_dropped`` (warning) for ``op`` to ``log``
    (default: the ``mqproxy.remoting`` logger)."""
    target = _log if log is None else log

    def on_dropped(msg: StoredMessage, dropped: DroppedProperties) -> None:
        target.warning(
            "remoting.properties_dropped",
            op=op,
            client_id=client_id,
            topic=msg.topic,
            queue_id=msg.queue_id,
            offset=msg.queue_offset,
            msg_id=msg.properties.get(PROPERTY_UNIQ_KEY, ""),
            dropped_properties=[key[:_KEY_CHARS] for key in dropped.keys],
            properties_bytes=dropped.bytes_before,
        )

    return on_dropped


def records_body(session: RemotingSession, messages: Iterable[StoredMessage], op: str) -> bytes:
    """The concatenated records of ``messages`` for this session's client (IPv4 hosts for legacy clients)."""
    return encode_records(
        messages,
        legacy=session.legacy_records,
        on_dropped=dropped_logger(op, session.client_id, session.log),
    )
