"""mqproxy: one TCP port for RocketMQ remoting, MQTT and RocketMQ 5 gRPC clients, on a durable store.

The repository's folders install as sub-packages of this one import package (see pyproject.toml):
``proxy/`` is ``mqproxy`` itself (the I/O layer), ``codecs/`` is ``mqproxy.codecs``, and so on.
"""

__version__ = "0.1.0"
