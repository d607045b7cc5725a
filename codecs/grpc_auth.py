"""
mqproxy.codecs.grpc_auth
~~~~~~~~~~~~~~~~~~~~~~~~

The ``authorization`` header of RocketMQ 5 gRPC calls (ACL 1.0 accounts), as the official clients write it:

    ``MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<hex>``

The signature is HmacSHA1 keyed by the secret key (UTF-8) over the value of the ``x-mq-date-time`` header
(UTF-8), written in hex: upper case from the Java client, lower case from the Go client, so it is compared
case-insensitively. The Go client writes ``Credential=<AK>//Rocketmq``: the access key is the credential up
to its first ``/`` (as RocketMQ's proxy reads it). Items are separated by ``,`` (spaces around them are
ignored) and may come in any order; ``SignedHeaders`` may be left out, but when present it must name
``x-mq-date-time`` only (nothing else is ever signed).

Pure functions: a server parses with :func:`parse_authorization` and checks with :func:`verify`; tests
(and any client) build the header with :func:`authorization_value`. Errors never echo the signature.
"""

from __future__ import annotations

import hashlib
import hmac
import string
from dataclasses import dataclass

__all__ = [
    "AUTHORIZATION",
    "DATE_TIME",
    "SCHEME",
    "SESSION_TOKEN",
    "Authorization",
    "AuthorizationError",
    "authorization_value",
    "parse_authorization",
    "signature_of",
    "verify",
]

#: gRPC metadata keys (lower case, as HTTP/2 carries them).
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
SESSION_TOKEN = "x-mq-session-token"
SCHEME = "MQv2-HMAC-SHA1"
#: A SHA-1 digest in hex.
SIGNATURE_HEX_LENGTH = 40
#: Longest header value parsed (a real one is about 120 characters plus the access key).
MAX_AUTHORIZATION_CHARS = 1024

_HEX = frozenset(string.hexdigits)


class AuthorizationError(ValueError):
    """A malformed ``authorization`` header; the message says what is wrong (never the signature)."""


@dataclass(frozen=True, slots=True)
class Authorization:
    """A parsed header: the access key and the signature in lower-case hex."""

    access_key: str
    signature: str


def parse_authorization(value: str) -> Authorization:
    """Parse an ``authorization`` value; raises :class:`AuthorizationError` if it is malformed."""
    if len(value) > MAX_AUTHORIZATION_CHARS:
        raise AuthorizationError(f"authorization header longer than {MAX_AUTHORIZATION_CHARS} characters")
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != SCHEME.lower():
        raise AuthorizationError(f"authorization scheme is not {SCHEME}")
    items: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, item = part.strip().partition("=")
        if not eq:
            raise AuthorizationError(f"authorization item {key[:32]!r} has no value")
        key = key.strip().lower()
        if key in items:
            raise AuthorizationError(f"authorization item {key!r} given twice")
        items[key] = item.strip()
    credential = items.get("credential")
    if not credential:
        raise AuthorizationError("authorization header has no Credential")
    access_key = credential.partition("/")[0]
    if not access_key:
        raise AuthorizationError("authorization Credential has no access key")
    signed = items.get("signedheaders")
    if signed is not None and [h.strip().lower() for h in signed.split(";")] != [DATE_TIME]:
        raise AuthorizationError(f"SignedHeaders must be {DATE_TIME}")
    signature = items.get("signature")
    if not signature:
        raise AuthorizationError("authorization header has no Signature")
    if len(signature) != SIGNATURE_HEX_LENGTH or not _HEX.issuperset(signature):
        raise AuthorizationError(f"Signature is not {SIGNATURE_HEX_LENGTH} hex digits")
    return Authorization(access_key, signature.lower())


def signature_of(secret_key: str, date_time: str) -> str:
    """HmacSHA1(``secret_key``, ``date_time``) in lower-case hex."""
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest()


def verify(auth: Authorization, secret_key: str, date_time: str) -> bool:
    """Whether ``auth``'s signature is the one ``secret_key`` gives ``date_time`` (constant time)."""
    return hmac.compare_digest(signature_of(secret_key, date_time), auth.signature)


def authorization_value(
    access_key: str, secret_key: str, date_time: str, *, upper: bool = True, credential_suffix: str = ""
) -> str:
    """The header a client sends (Java: upper-case hex; Go: lower case with ``credential_suffix``
    ``"//Rocketmq"``)."""
    signature = signature_of(secret_key, date_time)
    return (
        f"{SCHEME} Credential={access_key}{credential_suffix}, SignedHeaders={DATE_TIME}, "
        f"Signature={signature.upper() if upper else signature}"
    )
