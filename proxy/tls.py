"""Server-side TLS context for TLS terminated on the shared port (ALPN ``h2`` and ``http/1.1``)."""

from __future__ import annotations

import ssl

from mqproxy.settings import SettingsError, TlsSettings

ALPN_PROTOCOLS = ("h2", "http/1.1")


def server_ssl_context(settings: TlsSettings) -> ssl.SSLContext | None:
    """A context loaded from the configured certificate chain and key, or None when TLS is off."""
    if not settings.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(settings.cert_file, settings.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"tls.cert_file/tls.key_file: cannot load: {exc}") from None
    ctx.set_alpn_protocols(list(ALPN_PROTOCOLS))
    return ctx
