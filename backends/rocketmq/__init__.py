"""
mqproxy.backends.rocketmq
~~~~~~~~~~~~~~~~~~~~~~~~~

The cluster backend: a stateless mqproxy node in front of a stock Apache RocketMQ cluster (name servers
and brokers), reached as a remoting client (:mod:`mqproxy.remoting_client`).

* :func:`open_rocketmq_broker` / :class:`RocketMQBroker`: the :class:`~mqproxy.facade.api.BrokerFacade`.
* :class:`ClusterConfig`: where the cluster is (``[backend]`` settings).
"""

from __future__ import annotations

from mqproxy.backends.rocketmq.broker import RocketMQBroker as RocketMQBroker
from mqproxy.backends.rocketmq.broker import open_rocketmq_broker as open_rocketmq_broker
from mqproxy.backends.rocketmq.cluster import ClusterConfig as ClusterConfig
