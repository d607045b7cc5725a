"""
mqproxy.acl.throttle
~~~~~~~~~~~~~~~~~~~~

Per source address back-off after failed authentication, sans-IO (the caller passes ``now``, a monotonic
time in seconds).

The first ``free_failures`` failures cost nothing; each later one doubles the wait, from ``base_delay`` up
to ``max_delay``. While :meth:`AuthThrottle.delay_for` is positive a protocol layer refuses (or delays) the
next attempt from that address without evaluating its credentials, so a password guesser gets a bounded
number of tries per second. A success forgets the address; an address quiet for ``forget_after`` seconds
is forgotten too, and at most ``max_addresses`` are remembered (the least recently failed go first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["AuthThrottle"]


@dataclass
class _Entry:
    failures: int
    last: float


class AuthThrottle:
    """Failed-authentication back-off per source address."""

    def __init__(
        self,
        *,
        free_failures: int = 3,
        base_delay: float = 0.1,
        max_delay: float = 5.0,
        forget_after: float = 60.0,
        max_addresses: int = 10_000,
    ) -> None:
        self.free_failures = free_failures
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.forget_after = forget_after
        self.max_addresses = max_addresses
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _backoff(self, failures: int) -> float:
        over = failures - self.free_failures
        if over <= 0:
            return 0.0
        return min(self.max_delay, self.base_delay * 2 ** min(over - 1, 62))

    def delay_for(self, ip: str, now: float) -> float:
        """Seconds the next attempt from ``ip`` must wait (0 = none)."""
        entry = self._entries.get(ip)
        if entry is None:
            return 0.0
        if now - entry.last >= self.forget_after:
            del self._entries[ip]
            return 0.0
        return max(0.0, entry.last + self._backoff(entry.failures) - now)

    def failed(self, ip: str, now: float) -> None:
        """Record one failed authentication from ``ip``."""
        entry = self._entries.pop(ip, None)
        if entry is None or now - entry.last >= self.forget_after:
            entry = _Entry(0, now)
        entry.failures += 1
        entry.last = now
        self._entries[ip] = entry
        while len(self._entries) > self.max_addresses:
            self._entries.popitem(last=False)

    def succeeded(self, ip: str) -> None:
        """Forget ``ip``'s failures."""
        self._entries.pop(ip, None)
