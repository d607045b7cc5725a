"""
mqproxy.connector
~~~~~~~~~~~~~~~~~

The Message Connector (``mqproxy connect``): copies topics between clusters (mqproxy nodes or stock
RocketMQ clusters) by rules, exactly once across crashes, with work sharing between processes.

Sans-IO: :mod:`.rules` (the rules file), :mod:`.origin` (message translation and origin properties),
:mod:`.progress` (recovery from the target's tail, queue mapping, allocation, filters).
I/O: :mod:`.client` (one cluster over the remoting client), :mod:`.tail` (reading a target queue
backwards), :mod:`.copier` (one source queue), :mod:`.runner` (rules, work sharing, signals),
:mod:`.telemetry` (metrics, events, ``/metrics``), :mod:`.cli` (the command).
"""
