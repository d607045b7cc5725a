"""Backend errors as remoting responses: a cluster broker's own refusal keeps its code and remark; the rest
map by class (most specific first)."""

from __future__ import annotations

from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable, TopicNotFound
from mqproxy.remoting.session import backend_error_reply


def test_a_brokers_refusal_passes_through_unchanged() -> None:
    reply = backend_error_reply(BrokerRefused(26, "subscription group [g] does not exist, ..."))
    assert (reply.code, reply.remark) == (26, "subscription group [g] does not exist, ...")


def test_an_unreachable_cluster_is_service_not_available_with_the_reason() -> None:
    reply = backend_error_reply(ClusterUnavailable("name server 127.0.0.1:1 unreachable: connect failed"))
    assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert reply.remark is not None
    assert "127.0.0.1:1 unreachable" in reply.remark


def test_other_errors_map_by_class() -> None:
    assert backend_error_reply(TopicNotFound("T")).code == ResponseCode.TOPIC_NOT_EXIST
