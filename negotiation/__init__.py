"""
mqproxy.negotiation
~~~~~~~~~~~~~~~~~~~

Pure protocol sniffing over a connection's first bytes (no I/O): see :mod:`.sniff`, whose public names
(``sniff.__all__``) this package re-exports.
"""

from __future__ import annotations

from mqproxy.negotiation import sniff as _sniff
from mqproxy.negotiation.sniff import *  # noqa: F403

__all__ = list(_sniff.__all__)
