"""Header coercion rules: lenient integers and booleans, short and long send keys, pull defaults."""

from __future__ import annotations

import pytest

from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.remoting.errors import HeaderError
from mqproxy.remoting.headers import Fields, PullHeader, SendHeader, parse_header


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("TRUE", True), (" True ", True), ("1", True), ("false", False), ("False", False),
     ("0", False)],
)  # fmt: skip
def test_lenient_booleans(raw, expected) -> None:
    assert Fields({"k": raw}).boolean("k") is expected


@pytest.mark.parametrize("raw", ["yes", "2", "t", "nope"])
def test_bad_booleans(raw) -> None:
    with pytest.raises(HeaderError) as info:
        Fields({"k": raw}).boolean("k")
    assert info.value.key == "k"
    assert info.value.code == ResponseCode.INVALID_PARAMETER


def test_integers() -> None:
    fields = Fields({"i": " -12 ", "big": str(2**40), "blank": "", "neg": "-2147483648"})
    assert fields.integer("i") == -12
    assert fields.integer("big", wide=True) == 2**40
    assert fields.integer("neg") == -(2**31)
    assert fields.integer("blank", 5) == 5  # blank counts as missing
    assert fields.optional_integer("missing") is None
    with pytest.raises(HeaderError, match="out of range"):
        fields.integer("big")
    with pytest.raises(HeaderError, match="'blank' is missing"):
        fields.integer("blank")


def test_send_header_short_and_long_keys_agree() -> None:
    long = {"producerGroup": "PG", "topic": "T", "queueId": "1", "sysFlag": "0", "bornTimestamp": "9",
            "flag": "2", "properties": "A\x01b\x02", "reconsumeTimes": "1", "maxReconsumeTimes": "3",
            "defaultTopicQueueNums": "8"}  # fmt: skip
    short = {"a": "PG", "b": "T", "e": "1", "f": "0", "g": "9", "h": "2", "i": "A\x01b\x02", "j": "1",
             "l": "3", "d": "8"}  # fmt: skip
    assert parse_header(SendHeader, long) == parse_header(SendHeader, short, short_keys=True)


def test_pull_header_defaults() -> None:
    header = parse_header(PullHeader, {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "0",
                                "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "0",
                                "suspendTimeoutMillis": "15000"})  # fmt: skip
    assert header.suspend
    assert not header.has_subscription
    assert not header.has_commit_offset
    assert header.expression_type is None  # the registered subscription's type applies
    assert header.max_msg_bytes is None
