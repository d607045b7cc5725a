"""
mqproxy.remoting.reply
~~~~~~~~~~~~~~~~~~~~~~

The two values every request handler works with: :class:`Reply` (what to answer) and :class:`Note`
(facts about the request for its log event). Handlers are
``async def handler(session, request, note) -> Reply`` and may raise
:class:`~mqproxy.remoting.errors.RequestError` or :class:`~mqproxy.model.errors.BackendError` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqproxy.codecs.remoting_codes import ResponseCode


@dataclass(slots=True)
class Reply:
    """What a handler answers: response code, header fields (strings), body, remark."""

    code: ResponseCode
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None


@dataclass(slots=True)
class Note:
    """Per-request facts a handler records for the log event (set them before anything can fail)."""

    group: str | None = None
    topic: str | None = None
    #: Set by the caller: answer now or raise :class:`~mqproxy.remoting.errors.WouldWait` (a pull that
    #: would be held); see ``ConnectionLimits.batch_codes``.
    answer_at_once: bool = False
