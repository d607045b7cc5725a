"""
mqproxy.backends
~~~~~~~~~~~~~~~~

Implementations of :class:`~mqproxy.facade.BrokerFacade`: the embedded broker (a commit log with queue
indexes and the broker services over it) is the default.
"""
