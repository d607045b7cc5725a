"""
mqproxy.negotiation
~~~~~~~~~~~~~~~~~~~

Pure protocol sniffing over a connection's first bytes (no I/O): see :mod:`.sniff`.
"""

from __future__ import annotations

from mqproxy.negotiation.sniff import ALL as ALL
from mqproxy.negotiation.sniff import DETECTORS as DETECTORS
from mqproxy.negotiation.sniff import MAX_SNIFF_BYTES_NEEDED as MAX_SNIFF_BYTES_NEEDED
from mqproxy.negotiation.sniff import Detected as Detected
from mqproxy.negotiation.sniff import NeedMore as NeedMore
from mqproxy.negotiation.sniff import Protocol as Protocol
from mqproxy.negotiation.sniff import Unknown as Unknown
from mqproxy.negotiation.sniff import Verdict as Verdict
from mqproxy.negotiation.sniff import sniff as sniff

__all__ = [
    "ALL",
    "DETECTORS",
    "MAX_SNIFF_BYTES_NEEDED",
    "Detected",
    "NeedMore",
    "Protocol",
    "Unknown",
    "Verdict",
    "sniff",
]
