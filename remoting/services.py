"""
mqproxy.remoting.services
~~~~~~~~~~~~~~~~~~~~~~~~~

Access to the server's :class:`~mqproxy.backends.embedded.services.BrokerServices` from handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.remoting.errors import RequestError

if TYPE_CHECKING:
    from mqproxy.backends.embedded.services import BrokerServices
    from mqproxy.remoting.session import RemotingSession


def require_services(session: RemotingSession, what: str) -> BrokerServices:
    """``session.ctx.services``, or SERVICE_NOT_AVAILABLE (14) naming ``what`` when it is not running."""
    services = session.ctx.services
    if services is None:
        raise RequestError(ResponseCode.SERVICE_NOT_AVAILABLE, f"{what} are not available on this server")
    return services
