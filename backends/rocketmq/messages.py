"""
mqproxy.backends.rocketmq.messages
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Sans-IO translation of messages between a real broker's coordinates and what clients of this node see.

Contract: a message handed to a protocol has its virtual queue id, a commit-log offset packed with its
broker's index (:func:`~.vqueues.pack_offset`) and this node's advertised address as store host, so a
message id built from it comes back to a node that can find the broker again. A queue the topic's map
does not know keeps its real id (system topics are not numbered).
"""

from __future__ import annotations

import dataclasses

from mqproxy.backends.rocketmq.cluster import TopicView
from mqproxy.backends.rocketmq.vqueues import pack_offset
from mqproxy.model.types import StoredMessage

__all__ = ["to_client"]


def to_client(
    message: StoredMessage,
    broker: str,
    broker_index: int,
    view: TopicView | None,
    advertised: tuple[str, int],
) -> StoredMessage:
    """``message`` read from ``broker`` as this node presents it."""
    virtual = view.queues.virtual(broker, message.queue_id) if view is not None else None
    return dataclasses.replace(
        message,
        queue_id=message.queue_id if virtual is None else virtual,
        commitlog_offset=pack_offset(broker_index, message.commitlog_offset),
        store_host=advertised,
    )
