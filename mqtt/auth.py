"""MQTT authentication (user name + password) and topic authorization (per-user ACL patterns).

Password lines have the form ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``: PBKDF2-HMAC-SHA256
(``hashlib.pbkdf2_hmac``) of the password bytes (UTF-8 for the CLI), standard base64 with padding, a 32-byte
derived key. Verification compares in constant time and runs in a worker thread (bounded by a
limiter), so a slow hash never stalls the event loop. The last password that verified for each user is
remembered as an HMAC under a per-process random key, so reconnects of a device skip the PBKDF2 cost
(about 370 ms at 600 000 iterations on the project's machine class).
``python -m mqproxy.mqtt.auth hash <password>`` prints such a line.

Rules of :class:`Authorizer`:

* CONNECT without a user name: accepted if ``allow_anonymous`` else refused with Not authorized (0x87;
  3.1.1 return code 5).
* CONNECT with a user name listed in ``users``: the password must verify, else Bad user name or password
  (0x86; 3.1.1 return code 4). A user name not listed is refused the same way, unless ``users`` is empty
  and anonymous access is allowed (the name is then only a label, as in mosquitto without a password file).
* Topics: with an empty ``acl`` every topic is allowed. Otherwise a client may publish to a topic (and
  subscribe to a filter) only if one of the patterns of its user name or of ``*`` covers it. ``%c`` in a
  pattern is the client id, ``%u`` the user name; a pattern whose substitution is empty or holds ``/``,
  ``+`` or ``#`` matches nothing (a client id must not widen its own grant). A subscription filter is
  covered when every topic it can match is matched by the pattern (``$share/<group>/`` is ignored).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import trio

from mqproxy.codecs.mqtt import MqttCodecError, ReasonCode, parse_topic_filter, topic_matches

SCHEME = "pbkdf2_sha256"
#: Iterations of a new hash (OWASP's 2023 figure for PBKDF2-HMAC-SHA256).
DEFAULT_ITERATIONS = 600_000
MAX_ITERATIONS = 10_000_000
SALT_BYTES = 16
KEY_BYTES = 32
ACL_KINDS = ("publish", "subscribe")
ANY_USER = "*"
HASH_THREADS = 2


@dataclass(frozen=True, slots=True)
class PasswordHash:
    iterations: int
    salt: bytes
    key: bytes


def hash_password(password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """A new ``pbkdf2_sha256$...`` line for ``password`` (random 16-byte salt unless given)."""
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be in 1..{MAX_ITERATIONS}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    key = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations, KEY_BYTES)
    b64 = base64.b64encode
    return f"{SCHEME}${iterations}${b64(salt).decode('ascii')}${b64(key).decode('ascii')}"


def parse_password_hash(line: str) -> PasswordHash:
    """Parse a hash line; ValueError says what is wrong (never echoes the hash)."""
    parts = line.split("$")
    if len(parts) != 4 or parts[0] != SCHEME:
        raise ValueError(f"expected {SCHEME}$<iterations>$<salt b64>$<hash b64>")
    try:
        iterations = int(parts[1])
        salt = base64.b64decode(parts[2], validate=True)
        key = base64.b64decode(parts[3], validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("iterations must be an integer and salt/hash standard base64") from None
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be in 1..{MAX_ITERATIONS}")
    if not salt or len(key) < 16:
        raise ValueError("salt must not be empty and the hash must hold at least 16 bytes")
    return PasswordHash(iterations, salt, key)


def verify_password(password: bytes, parsed: PasswordHash) -> bool:
    """Constant-time check of raw password bytes against a parsed hash."""
    key = hashlib.pbkdf2_hmac("sha256", password, parsed.salt, parsed.iterations, len(parsed.key))
    return hmac.compare_digest(key, parsed.key)


def check_acl(rules: Mapping[str, Sequence[str]]) -> None:
    """ValueError unless ``rules`` has only publish/subscribe lists of valid filter patterns."""
    for kind, patterns in rules.items():
        if kind not in ACL_KINDS:
            raise ValueError(f"unknown key {kind!r} (known: {', '.join(ACL_KINDS)})")
        for pattern in patterns:
            try:
                parse_topic_filter(pattern.replace("%c", "c").replace("%u", "u"))
            except MqttCodecError:
                raise ValueError(f"{kind}: invalid topic filter pattern {pattern!r}") from None


def _expand(pattern: str, client_id: str, username: str | None) -> str | None:
    for token, value in (("%c", client_id), ("%u", username)):
        if token in pattern:
            if not value or any(ch in value for ch in "/+#"):
                return None
            pattern = pattern.replace(token, value)
    return pattern


def filter_covers(pattern: str, topic_filter: str) -> bool:
    """True if every topic matched by ``topic_filter`` is matched by ``pattern`` (both valid filters)."""
    p_levels = pattern.split("/")
    f_levels = topic_filter.split("/")
    for i, level in enumerate(f_levels):
        if i >= len(p_levels):
            return False
        want = p_levels[i]
        dollar = i == 0 and level.startswith("$")
        if want == "#":
            return not dollar
        if want == "+":
            if level == "#" or dollar:
                return False
            continue
        if want != level:
            return False
    return len(p_levels) == len(f_levels) or (len(p_levels) == len(f_levels) + 1 and p_levels[-1] == "#")


@dataclass(frozen=True, slots=True)
class Authorizer:
    """The gateway's authentication and ACL decisions (see the module docstring for the rules)."""

    allow_anonymous: bool = True
    users: Mapping[str, PasswordHash] = field(default_factory=dict)
    acl: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    _limiter: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(HASH_THREADS), compare=False, repr=False
    )
    #: user name -> HMAC(_cache_key, password) of the last password that verified.
    _verified: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    _cache_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), compare=False, repr=False)

    @classmethod
    def from_settings(
        cls,
        allow_anonymous: bool,
        users: Mapping[str, str],
        acl: Mapping[str, Mapping[str, Sequence[str]]],
    ) -> Authorizer:
        for rules in acl.values():
            check_acl(rules)
        return cls(
            allow_anonymous,
            {user: parse_password_hash(line) for user, line in users.items()},
            {user: {kind: tuple(p) for kind, p in rules.items()} for user, rules in acl.items()},
        )

    async def authenticate(self, username: str | None, password: bytes | None) -> ReasonCode:
        """SUCCESS, BAD_USER_NAME_OR_PASSWORD or NOT_AUTHORIZED for a CONNECT's credentials."""
        if username is None:
            return ReasonCode.SUCCESS if self.allow_anonymous else ReasonCode.NOT_AUTHORIZED
        parsed = self.users.get(username)
        if parsed is None:
            if not self.users and self.allow_anonymous:
                return ReasonCode.SUCCESS
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if password is None:
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        tag = hmac.digest(self._cache_key, password, "sha256")
        known = self._verified.get(username)
        if known is not None and hmac.compare_digest(known, tag):
            return ReasonCode.SUCCESS
        ok = await trio.to_thread.run_sync(partial(verify_password, password, parsed), limiter=self._limiter)
        if not ok:
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        self._verified[username] = tag
        return ReasonCode.SUCCESS

    def _patterns(self, kind: str, client_id: str, username: str | None) -> list[str]:
        out: list[str] = []
        for who in (username, ANY_USER):
            rules = self.acl.get(who) if who is not None else None
            for pattern in rules.get(kind, ()) if rules else ():
                expanded = _expand(pattern, client_id, username)
                if expanded is not None:
                    out.append(expanded)
        return out

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        if not self.acl:
            return True
        return any(topic_matches(p, topic) for p in self._patterns("publish", client_id, username))

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        if not self.acl:
            return True
        inner = parse_topic_filter(topic_filter).filter
        return any(filter_covers(p, inner) for p in self._patterns("subscribe", client_id, username))


ALLOW_ALL = Authorizer()


def main(argv: Sequence[str]) -> int:
    """``hash <password> [--iterations N]``: print a hash line for the ``[mqtt.users]`` table."""
    args = list(argv)
    iterations = DEFAULT_ITERATIONS
    if "--iterations" in args:
        at = args.index("--iterations")
        try:
            iterations = int(args[at + 1])
        except (IndexError, ValueError):
            print("--iterations needs an integer", file=sys.stderr)
            return 2
        del args[at : at + 2]
    if len(args) != 2 or args[0] != "hash":
        print("usage: python -m mqproxy.mqtt.auth hash <password> [--iterations N]", file=sys.stderr)
        return 2
    try:
        print(hash_password(args[1], iterations))
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
