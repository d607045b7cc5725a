"""
mqproxy.rejections
~~~~~~~~~~~~~~~~~~

:class:`RejectionRing`: the last few refusals for the console's "Recent rejections", sans-IO (the caller
passes the time). Fed where the refusals are reported: ``auth.denied`` (through
:class:`mqproxy.acl.holder.AclHolder`: every protocol and the console itself) and ``conn.rejected``
(negotiation failures, :mod:`mqproxy.connection`).
Bounded (:data:`RING_SIZE`, oldest dropped); texts are clipped to :data:`MAX_TEXT` characters, so a client
cannot make the ring large with long ids or reasons.
"""

from __future__ import annotations

from collections import deque

from mqproxy.console_view import RejectionRow

__all__ = ["MAX_TEXT", "RING_SIZE", "RejectionRing"]

#: Refusals kept.
RING_SIZE = 50
#: Characters kept of any one text field.
MAX_TEXT = 200


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT:
        return text
    return text[: MAX_TEXT - 1] + "…"


class RejectionRing:
    """The last :data:`RING_SIZE` refusals, newest first from :meth:`rows`."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self._rows: deque[RejectionRow] = deque(maxlen=size)
        #: Refusals ever added (the ring keeps only the last ones).
        self.total = 0

    def add(
        self,
        at_unix_s: float,
        event: str,
        *,
        protocol: str | None,
        peer: str,
        reason: str,
        detail: str | None = None,
        access_key: str | None = None,
    ) -> None:
        self.total += 1
        self._rows.append(
            RejectionRow(
                at_unix_s=at_unix_s,
                event=event,
                protocol=_clip(protocol),
                peer=_clip(peer) or "",
                reason=_clip(reason) or "",
                detail=_clip(detail),
                access_key=_clip(access_key),
            )
        )

    def rows(self) -> tuple[RejectionRow, ...]:
        return tuple(reversed(self._rows))
