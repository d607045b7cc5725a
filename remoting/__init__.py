"""
mqproxy.remoting
~~~~~~~~~~~~~~~~

The RocketMQ 4.x remoting protocol on top of the :class:`~mqproxy.backends.embedded.store.MessageStore`: a per-
connection :class:`RemotingSession` (no I/O; one handler per request code) and the trio driver
:func:`serve_remoting` with the server-wide :class:`ConnectionRegistry` of consumer-group and
producer-group connections (``ConnectionRegistry.check_transaction`` is the transaction check-back
sender for :class:`~mqproxy.backends.embedded.services.BrokerServices`).
"""

from __future__ import annotations

from mqproxy.remoting.connection import (
    ConnectionLimits as ConnectionLimits,
)
from mqproxy.remoting.connection import (
    ConnectionRegistry as ConnectionRegistry,
)
from mqproxy.remoting.connection import (
    ConnectionStats as ConnectionStats,
)
from mqproxy.remoting.connection import (
    serve_remoting as serve_remoting,
)
from mqproxy.remoting.context import RequestEvent as RequestEvent
from mqproxy.remoting.context import ServerContext as ServerContext
from mqproxy.remoting.session import RemotingSession as RemotingSession
