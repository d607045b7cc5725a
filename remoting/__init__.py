"""
mqproxy.remoting
~~~~~~~~~~~~~~~~

The RocketMQ 4.x remoting protocol on top of the :class:`~mqproxy.facade.api.BrokerFacade`: a per-
connection :class:`RemotingSession` (no I/O; one handler per request code), the trio driver
:func:`serve_remoting`, and :class:`RemotingService`, the protocol service the server runs (it owns the
server-wide :class:`ConnectionRegistry` of consumer-group and producer-group connections and registers
its transaction check-back sender with the facade).
"""

from __future__ import annotations

from mqproxy.remoting.connection import ConnectionLimits as ConnectionLimits
from mqproxy.remoting.connection import ConnectionStats as ConnectionStats
from mqproxy.remoting.connection import serve_remoting as serve_remoting
from mqproxy.remoting.context import RequestEvent as RequestEvent
from mqproxy.remoting.context import ServerContext as ServerContext
from mqproxy.remoting.registry import ConnectionRegistry as ConnectionRegistry
from mqproxy.remoting.service import RemotingService as RemotingService
from mqproxy.remoting.session import RemotingSession as RemotingSession
