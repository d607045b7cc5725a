"""
mqproxy.acl
~~~~~~~~~~~

Access control from one RocketMQ ACL 1.0 account file (``plain_acl.yml``) for every protocol.

Sans-IO: :mod:`.rules` parses the file, :mod:`.addresses` matches white remote addresses,
:mod:`.check` answers permission questions, :mod:`.throttle` backs off failed authentication and
:mod:`.holder` keeps the live rules that a reload swaps. No module here touches a socket or a clock.
"""
