"""
mqproxy.acl.addresses
~~~~~~~~~~~~~~~~~~~~~

White remote address patterns in the forms RocketMQ's ``RemoteAddressStrategyFactory`` accepts:

- blank: matches nothing;
- ``*``, ``*.*.*.*`` or ``*:*:*:*:*:*:*:*``: matches every address;
- ``192.168.0.{1,2}`` (braces in the last part): each listed address;
- ``10.0.0.1,10.0.0.2`` (commas): each listed address;
- ``192.168.1.1-5``, ``192.168.*``, ``192.168.1-3.*``: one ranged part (``*`` or ``a-b``); every later
  part must be ``*`` or absent, every earlier part is literal. IPv6 takes the same forms in hex groups;
- a plain IPv4 or IPv6 address.

:func:`compile_pattern` raises :class:`ValueError` naming the problem for anything else.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["AddressMatcher", "compile_pattern", "normalize_ip"]


@lru_cache(maxsize=4096)
def normalize_ip(ip: str) -> str:
    """The canonical text of ``ip``: IPv4-mapped IPv6 becomes IPv4, IPv6 is fully expanded, upper case.

    Text that is not an address is returned stripped and unchanged (it then matches only ``*``).
    """
    text = ip.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return text
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return addr.exploded.upper()
    return str(addr)


@dataclass(frozen=True)
class AddressMatcher:
    """A compiled pattern: ``everything``, a set of exact addresses, or a prefix plus one ranged part."""

    everything: bool = False
    exact: frozenset[str] = frozenset()
    #: For ranges: literal leading parts, the ranged part's bounds, and whether IPv6.
    head: tuple[int, ...] | None = None
    low: int = 0
    high: int = 0
    v6: bool = False

    def matches(self, ip: str) -> bool:
        if self.everything:
            return True
        canonical = normalize_ip(ip)
        if canonical in self.exact:
            return True
        if self.head is None:
            return False
        parts = _parts(canonical, self.v6)
        if parts is None:
            return False
        n = len(self.head)
        return parts[:n] == self.head and self.low <= parts[n] <= self.high


NOTHING = AddressMatcher()


def _parts(canonical: str, v6: bool) -> tuple[int, ...] | None:
    try:
        addr = ipaddress.ip_address(canonical)
    except ValueError:
        return None
    if v6 != isinstance(addr, ipaddress.IPv6Address):
        return None
    if v6:
        return tuple(int(group, 16) for group in addr.exploded.split(":"))
    return tuple(int(octet) for octet in canonical.split("."))


def _one_address(text: str) -> str:
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(f"not an IP address: {text.strip()!r}") from None
    return normalize_ip(str(addr))


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str | None) -> AddressMatcher:
    """Compile one white remote address pattern (see the module docstring); cached."""
    text = (pattern or "").strip()
    if not text:
        return NOTHING
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressMatcher(everything=True)
    if text.endswith("}"):
        head, brace, items = text[:-1].rpartition("{")
        if not brace or not head or head[-1] not in ".:":
            raise ValueError(f"braces must enclose the last part of the address: {text!r}")
        return AddressMatcher(exact=frozenset(_one_address(head + item) for item in items.split(",")))
    if "," in text:
        return AddressMatcher(exact=frozenset(_one_address(item) for item in text.split(",")))
    if "*" in text or "-" in text:
        return _compile_range(text)
    return AddressMatcher(exact=frozenset({_one_address(text)}))


def _compile_range(text: str) -> AddressMatcher:
    v6 = ":" in text
    sep, base, width, top = (":", 16, 8, 0xFFFF) if v6 else (".", 10, 4, 255)
    parts = [part.strip() for part in text.split(sep)]
    if len(parts) > width:
        raise ValueError(f"too many parts in address range: {text!r}")
    head: list[int] = []
    for index, part in enumerate(parts):
        if part == "*" or "-" in part:
            if index == 0:
                raise ValueError(f"the first part of an address range must be literal: {text!r}")
            if any(rest != "*" for rest in parts[index + 1 :]):
                raise ValueError(f"only '*' may follow the ranged part: {text!r}")
            low, high = 0, top
            if part != "*":
                first, _, last = part.partition("-")
                try:
                    low, high = int(first, base), int(last, base)
                except ValueError:
                    raise ValueError(f"bad range {part!r} in {text!r}") from None
                if not 0 <= low <= high <= top:
                    raise ValueError(f"bad range {part!r} in {text!r}")
            return AddressMatcher(head=tuple(head), low=low, high=high, v6=v6)
        try:
            value = int(part, base)
        except ValueError:
            raise ValueError(f"bad part {part!r} in address range {text!r}") from None
        if not 0 <= value <= top:
            raise ValueError(f"bad part {part!r} in address range {text!r}")
        head.append(value)
    raise ValueError(f"not an address range: {text!r}")  # pragma: no cover - '*' or '-' was present
