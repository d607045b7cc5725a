"""
mqproxy.remoting.errors
~~~~~~~~~~~~~~~~~~~~~~~

The one exception root of the remoting session layer. Every error carries the response code and
remark to answer with; the session turns it into an error response (or drops it for oneway requests).
Nothing here closes the connection: frame-level garbage is the codec's ``RemotingCodecError``.
"""

from __future__ import annotations

from mqproxy.codecs.remoting_codes import ResponseCode


class RequestError(Exception):
    """A request cannot be served; answer ``code`` with ``remark``."""

    def __init__(self, code: ResponseCode, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class WouldWait(Exception):
    """Raised by a handler whose ``note.answer_at_once`` is set when answering would wait (a pull that
    would be held): the caller runs the request again in its own task, where it may wait. Nothing the
    request changed before raising differs when it is run again (a pull's offset commit stores the same
    offset twice)."""


class HeaderError(RequestError):
    """A header field (``extFields`` key) is missing or does not have the type the request code needs.

    Answered with INVALID_PARAMETER (29): the request is malformed, so retrying it cannot help (a Java
    broker answers SYSTEM_ERROR with the exception text, which producers would retry pointlessly).
    """

    def __init__(self, key: str, problem: str = "is missing") -> None:
        super().__init__(ResponseCode.INVALID_PARAMETER, f"header field {key!r} {problem}")
        self.key = key
