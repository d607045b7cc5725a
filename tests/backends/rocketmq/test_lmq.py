"""Sans-IO helpers of the rocketmq backend's light message queues (:mod:`mqproxy.backends.rocketmq.lmq`)."""

from __future__ import annotations

import pytest

from mqproxy.backends.rocketmq.lmq import dispatch_targets, lmq_offsets, wait_answer, with_dispatch
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.model.errors import IllegalTopic
from mqproxy.model.types import PROPERTY_INNER_MULTI_DISPATCH, PROPERTY_INNER_MULTI_QUEUE_OFFSET, Message


def test_dispatch_targets_are_deduplicated_in_order() -> None:
    message = Message("Parent", b"x", dispatch=("%LMQ%b", "%LMQ%a", "%LMQ%b"))
    assert dispatch_targets(message) == ("%LMQ%b", "%LMQ%a")
    assert dispatch_targets(Message("Parent", b"x")) == ()


@pytest.mark.parametrize(
    ("topic", "dispatch"),
    [
        ("Parent", ("plain",)),
        ("Parent", ("%LMQ%",)),
        ("%RETRY%g", ("%LMQ%a",)),
        ("rmq_sys_wheel", ("%LMQ%a",)),
        ("SCHEDULE_TOPIC_XXXX", ("%LMQ%a",)),
    ],
)
def test_dispatch_targets_refuse_what_the_broker_would_not_dispatch(
    topic: str, dispatch: tuple[str, ...]
) -> None:
    with pytest.raises(IllegalTopic):
        dispatch_targets(Message(topic, b"x", dispatch=dispatch))


def test_with_dispatch_names_the_lmqs_and_leaves_the_original_alone() -> None:
    original = Message("Parent", b"x", properties={"KEYS": "k", PROPERTY_INNER_MULTI_QUEUE_OFFSET: "9"})
    sent = with_dispatch(original, ("%LMQ%a", "%LMQ%b"))
    assert sent.properties == {"KEYS": "k", PROPERTY_INNER_MULTI_DISPATCH: "%LMQ%a,%LMQ%b"}
    assert original.properties == {"KEYS": "k", PROPERTY_INNER_MULTI_QUEUE_OFFSET: "9"}
    assert (sent.topic, sent.body) == ("Parent", b"x")


def test_lmq_offsets_pair_names_and_offsets() -> None:
    props = {PROPERTY_INNER_MULTI_DISPATCH: "%LMQ%a,%LMQ%b", PROPERTY_INNER_MULTI_QUEUE_OFFSET: "4,0"}
    assert lmq_offsets(props) == {"%LMQ%a": 4, "%LMQ%b": 0}
    assert lmq_offsets({PROPERTY_INNER_MULTI_DISPATCH: "%LMQ%a"}) == {}
    unpaired = {PROPERTY_INNER_MULTI_DISPATCH: "%LMQ%a,%LMQ%b", PROPERTY_INNER_MULTI_QUEUE_OFFSET: "1"}
    assert lmq_offsets(unpaired) == {}
    # a name the broker skipped (not an LMQ) has the offset "null" in Java's join
    props = {PROPERTY_INNER_MULTI_DISPATCH: "x,%LMQ%b", PROPERTY_INNER_MULTI_QUEUE_OFFSET: "null,7"}
    assert lmq_offsets(props) == {"%LMQ%b": 7}


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        (ResponseCode.SUCCESS, True),
        (ResponseCode.PULL_RETRY_IMMEDIATELY, True),
        (ResponseCode.PULL_OFFSET_MOVED, True),
        (ResponseCode.PULL_NOT_FOUND, False),
        (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, None),
        (ResponseCode.SYSTEM_ERROR, None),
    ],
)
def test_wait_answer(code: int, answer: bool | None) -> None:
    assert wait_answer(code) is answer
