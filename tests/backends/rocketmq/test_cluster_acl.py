"""The cluster backend against brokers that enforce authentication (RocketMQ 5.3 ACL 2.0, which keeps the
ACL 1.0 remoting signature): with ``access_key``/``secret_key`` every request is signed and served; without
them, or with a wrong secret, the broker's refusal reaches the caller with its code and remark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import PullRequest, SendRequest
from mqproxy.model.errors import BrokerRefused
from mqproxy.model.types import Message, PullStatus

from .conftest import open_node, running_cluster, stock_rocketmq

pytestmark = pytest.mark.e2e

_AUTH = {
    "authenticationEnabled": "true",
    "authenticationProvider": (
        "org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider"
    ),
    "authenticationMetadataProvider": (
        "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider"
    ),
    "initAuthenticationUser": '{"username":"mqadmin","password":"s3cret-pass"}',
    "innerClientAuthenticationCredentials": '{"accessKey":"mqadmin","secretKey":"s3cret-pass"}',
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stock_rocketmq.StockCluster]:
    yield from running_cluster(
        tmp_path_factory.mktemp("secured"), brokers=1, cluster_name="Secured", broker_conf=_AUTH
    )


async def test_signed_requests_are_served(secured) -> None:
    async with open_node(secured.namesrv_addr, 1001, access_key="mqadmin", secret_key="s3cret-pass") as node:
        await node.create_topic("Signed", 1)
        sent = await node.send(SendRequest(Message("Signed", b"signed body")))
        pulled = await node.pull(
            PullRequest("g-signed", "Signed", sent.queue_id, sent.result.queue_offset, 4)
        )
        assert pulled.status is PullStatus.FOUND
        assert pulled.messages[0].body == b"signed body"


@pytest.mark.parametrize(
    ("keys", "remark"),
    [
        ({}, "username cannot be null"),
        ({"access_key": "mqadmin", "secret_key": "wrong"}, "check signature failed"),
    ],
)
async def test_unsigned_or_badly_signed_requests_get_the_brokers_refusal(secured, keys, remark) -> None:
    async with open_node(secured.namesrv_addr, 1002, **keys) as node:
        with pytest.raises(BrokerRefused) as refused:
            await node.create_topic("Refused", 1)
        assert refused.value.code == ResponseCode.NO_PERMISSION
        assert remark in refused.value.remark
