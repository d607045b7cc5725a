"""
mqproxy.remoting_client
~~~~~~~~~~~~~~~~~~~~~~~

A trio client for the RocketMQ remoting protocol, for talking to name servers and brokers (stock Apache
RocketMQ or another mqproxy node): the cluster backend and the message connector use it.

* :class:`RemotingConnection`: one multiplexed connection; requests are matched to responses by opaque,
  each with its own timeout; oneway requests; requests the server sends (CHECK_TRANSACTION_STATE,
  NOTIFY_CONSUMER_IDS_CHANGED, …) go to a handler whose answer is sent back.
* :class:`RemotingPool`: one connection per address, opened on first use, re-opened after a failure with
  exponential back-off, every request optionally signed with ACL 1.0 keys.
* :class:`~.outbox.FrameOutbox`: the coalescing write side of a multiplexed connection (concurrent
  callers' frames leave in one ``send_all``, no lock), shared with the client-facing remoting server.
"""

from __future__ import annotations

from mqproxy.remoting_client.connection import (
    ConnectionClosed as ConnectionClosed,
)
from mqproxy.remoting_client.connection import (
    RemotingClientError as RemotingClientError,
)
from mqproxy.remoting_client.connection import (
    RemotingConnection as RemotingConnection,
)
from mqproxy.remoting_client.connection import (
    RemotingTimeout as RemotingTimeout,
)
from mqproxy.remoting_client.connection import (
    ServerRequestHandler as ServerRequestHandler,
)
from mqproxy.remoting_client.pool import (
    AddressUnreachable as AddressUnreachable,
)
from mqproxy.remoting_client.pool import (
    ClientConfig as ClientConfig,
)
from mqproxy.remoting_client.pool import (
    RemotingPool as RemotingPool,
)
from mqproxy.remoting_client.pool import (
    open_pool as open_pool,
)
