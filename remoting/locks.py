"""
mqproxy.remoting.locks
~~~~~~~~~~~~~~~~~~~~~~

LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42), spec §3.15: orderly consumers lock the queues they were
assigned before consuming them, so that one queue is consumed by one client at a time.

Body ``{"consumerGroup","clientId","onlyThisBroker","mqSet":[{"topic","brokerName","queueId"}]}``.
LOCK answers ``{"lockOKMQSet":[...]}``: the requested queues this client now holds (a queue held by
another client whose lock has not expired is left out). Locks live
60 s unless renewed (clients re-lock every 20 s); a connection that ends releases
its clients' locks at once. UNLOCK releases the client's locks (often oneway). A client that
heartbeated on this connection may lock and unlock only for the consumer groups it joined
(NO_PERMISSION otherwise); a client that has not heartbeated yet (a fresh connection) is trusted.

The locks are the broker facade's (:class:`~mqproxy.facade.api.Locking`, shared with gRPC; queues keyed
by topic and queue id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.types import QueueRef as ServiceQueueRef
from mqproxy.remoting.errors import RequestError
from mqproxy.remoting.reply import Note, Reply

if TYPE_CHECKING:
    from mqproxy.remoting.session import RemotingSession


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """A MessageQueue as the client names it."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, object]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


def _bad(problem: str) -> RequestError:
    return RequestError(ResponseCode.INVALID_PARAMETER, f"lock request body {problem}")


def parse_lock_body(body: bytes) -> tuple[str, str, list[QueueRef]]:
    """(consumer group, client id, queues) of a LOCK/UNLOCK_BATCH_MQ body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad("is not JSON") from None
    if not isinstance(data, dict):
        raise _bad("is not a JSON object")
    group, client_id = data.get("consumerGroup"), data.get("clientId")
    if not isinstance(group, str) or not group:
        raise _bad("lacks 'consumerGroup'")
    if not isinstance(client_id, str) or not client_id:
        raise _bad("lacks 'clientId'")
    raw = data.get("mqSet") or []
    if not isinstance(raw, list):
        raise _bad("has a malformed 'mqSet'")
    return group, client_id, [_queue(item) for item in raw]


def _queue(item: Any) -> QueueRef:
    if not isinstance(item, dict):
        raise _bad("has a malformed 'mqSet' entry")
    topic, broker, queue_id = item.get("topic"), item.get("brokerName"), item.get("queueId")
    if not isinstance(topic, str) or not isinstance(broker, str):
        raise _bad("has a 'mqSet' entry without topic/brokerName")
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id < 2**31:
        raise _bad("has a 'mqSet' entry with a bad queueId")
    return QueueRef(topic, broker, queue_id)


def _check_member(session: RemotingSession, group: str, client_id: str) -> None:
    """A client that heartbeated on this connection may lock only for groups it joined."""
    own_groups = {g for g, cid in session.memberships if cid == client_id}
    if own_groups and group not in own_groups:
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"client {client_id[:128]} is not a member of consumer group {group[:255]}; "
            "it cannot lock its queues",
        )


async def lock_batch_mq(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    group, client_id, queues = parse_lock_body(request.body)
    note.group = group
    _check_member(session, group, client_id)
    got = await session.broker.lock_batch(group, client_id, [_service_ref(q) for q in queues])
    held = [q for q in queues if _service_ref(q) in got]
    session.lock_holders.add((group, client_id))
    body = orjson.dumps({"lockOKMQSet": [q.to_json() for q in held]})
    return Reply(ResponseCode.SUCCESS, body=body, remark=None if queues else "MessageQueue set is empty")


async def unlock_batch_mq(session: RemotingSession, request: RemotingCommand, note: Note) -> Reply:
    group, client_id, queues = parse_lock_body(request.body)
    note.group = group
    _check_member(session, group, client_id)
    await session.broker.unlock(group, client_id, [_service_ref(q) for q in queues])
    return Reply(ResponseCode.SUCCESS)


def _service_ref(queue: QueueRef) -> ServiceQueueRef:
    return ServiceQueueRef(queue.topic, queue.queue_id)
