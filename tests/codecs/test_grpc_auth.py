"""Tests for mqproxy.codecs.grpc_auth: the gRPC ``authorization`` header as the Java and Go clients
write it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqproxy.codecs.grpc_auth import (
    Authorization,
    AuthorizationError,
    authorization_value,
    parse_authorization,
    signature_of,
    verify,
)

DATE = "20261128T081500Z"
#: RFC 2202 test case 2 (HMAC-SHA1, key "Jefe").
RFC2202_KEY = "Jefe"
RFC2202_DATA = "what do ya want for nothing?"
RFC2202_HEX = "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"


def test_signature_is_hmac_sha1_in_hex() -> None:
    assert signature_of(RFC2202_KEY, RFC2202_DATA) == RFC2202_HEX


def test_java_header_upper_case_hex() -> None:
    value = (
        "MQv2-HMAC-SHA1 Credential=rocketmq2, SignedHeaders=x-mq-date-time, "
        f"Signature={RFC2202_HEX.upper()}"
    )
    auth = parse_authorization(value)
    assert auth == Authorization("rocketmq2", RFC2202_HEX)
    assert verify(auth, RFC2202_KEY, RFC2202_DATA)


def test_go_header_credential_suffix_lower_case_hex() -> None:
    value = (
        "MQv2-HMAC-SHA1 Credential=rocketmq2//Rocketmq, SignedHeaders=x-mq-date-time, "
        f"Signature={RFC2202_HEX}"
    )
    auth = parse_authorization(value)
    assert auth.access_key == "rocketmq2"
    assert verify(auth, RFC2202_KEY, RFC2202_DATA)


@pytest.mark.parametrize("upper", [True, False])
def test_built_header_round_trips(upper: bool) -> None:
    value = authorization_value("AK", "secret", DATE, upper=upper, credential_suffix="//Rocketmq")
    auth = parse_authorization(value)
    assert auth.access_key == "AK"
    assert verify(auth, "secret", DATE)
    assert not verify(auth, "Secret", DATE)
    assert not verify(auth, "secret", "20261128T081501Z")


def test_items_in_any_order_with_loose_spaces() -> None:
    sig = signature_of("s", DATE)
    auth = parse_authorization(
        f"  mqv2-hmac-sha1 Signature = {sig} ,Credential=ak,  SignedHeaders=X-MQ-DATE-TIME "
    )
    assert auth == Authorization("ak", sig)


def test_signed_headers_may_be_left_out() -> None:
    sig = signature_of("s", DATE)
    assert parse_authorization(f"MQv2-HMAC-SHA1 Credential=ak, Signature={sig}").access_key == "ak"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "scheme"),
        ("Bearer abc", "scheme"),
        ("MQv2-HMAC-SHA1", "no value"),
        (f"MQv2-HMAC-SHA1 SignedHeaders=x-mq-date-time, Signature={RFC2202_HEX}", "no Credential"),
        (f"MQv2-HMAC-SHA1 Credential=/Rocketmq, Signature={RFC2202_HEX}", "no access key"),
        ("MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time", "no Signature"),
        ("MQv2-HMAC-SHA1 Credential=ak, Signature=xyz", "hex digits"),
        (f"MQv2-HMAC-SHA1 Credential=ak, Signature={RFC2202_HEX}00", "hex digits"),
        (f"MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=host, Signature={RFC2202_HEX}", "SignedHeaders"),
        (f"MQv2-HMAC-SHA1 Credential=ak, Credential=bk, Signature={RFC2202_HEX}", "twice"),
        ("MQv2-HMAC-SHA1 Credential=" + "a" * 2000, "longer"),
    ],
)
def test_malformed_headers_are_refused(value: str, why: str) -> None:
    with pytest.raises(AuthorizationError, match=why) as info:
        parse_authorization(value)
    assert RFC2202_HEX not in str(info.value)


@given(st.text(max_size=300))
def test_any_text_parses_or_raises_authorization_error(value: str) -> None:
    try:
        auth = parse_authorization(value)
    except AuthorizationError:
        return
    assert auth.access_key
    assert len(auth.signature) == 40
