"""
mqproxy.facade
~~~~~~~~~~~~~~

The seam between the protocols and the broker behind the proxy: :class:`~mqproxy.facade.api.BrokerFacade`
and its request/result values (:mod:`.api`, :mod:`.types`). Protocols import this, the model and the
codecs; backends implement it.
"""
