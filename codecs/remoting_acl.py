"""
mqproxy.codecs.remoting_acl
~~~~~~~~~~~~~~~~~~~~~~~~~~~

RocketMQ ACL 1.0 request signatures on the remoting protocol, as ``AclClientRPCHook`` computes them.

The signed content is the values of every ext field except ``Signature`` (``AccessKey`` and
``SecurityToken`` included), in the order of their keys, concatenated with no separator and encoded as
UTF-8, followed by the raw body bytes. The signature is Base64(HmacSHA1(secretKey, content)).
Pure functions: the client signs with :func:`sign`, a server checks with :func:`signature_of`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["ACCESS_KEY", "SECURITY_TOKEN", "SIGNATURE", "sign", "signature_content", "signature_of"]

ACCESS_KEY = "AccessKey"
SECURITY_TOKEN = "SecurityToken"
SIGNATURE = "Signature"
#: Ext fields a verifying server leaves out of the content besides the signature itself.
_UNSIGNED = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


def signature_content(ext_fields: Mapping[str, str], body: bytes = b"") -> bytes:
    """The bytes the signature covers."""
    text = "".join(ext_fields[key] for key in sorted(ext_fields) if key not in _UNSIGNED)
    return text.encode("utf-8") + body


def signature_of(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> str:
    """Base64 HmacSHA1 of :func:`signature_content` keyed by ``secret_key``."""
    digest = hmac.new(secret_key.encode("utf-8"), signature_content(ext_fields, body), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(
    ext_fields: dict[str, str],
    body: bytes,
    access_key: str,
    secret_key: str,
    security_token: str | None = None,
) -> None:
    """Add ``AccessKey`` (and ``SecurityToken`` when given) and ``Signature`` to ``ext_fields`` in place."""
    ext_fields[ACCESS_KEY] = access_key
    if security_token:
        ext_fields[SECURITY_TOKEN] = security_token
    ext_fields.pop(SIGNATURE, None)
    ext_fields[SIGNATURE] = signature_of(ext_fields, body, secret_key)
