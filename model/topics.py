"""Topic naming rules and the topic metadata both backends share.

Rules (RocketMQ ``TopicValidator``, spec §9.6 and §3.2):

* legal characters are ``%``, ``|``, ``-``, ``_``, ``0-9``, ``A-Z``, ``a-z``; the name is not empty;
* at most 127 bytes, or 255 for names starting ``%RETRY%`` / ``%DLQ%``; but any *send* whose topic is
  longer than 127 bytes is refused (the broker answers MESSAGE_ILLEGAL), so such retry topics can exist
  without being written to;
* ``%LMQ%<name>`` topics (light message queues) always exist implicitly with exactly one queue (id 0)
  and are never stored as topic metadata;
* ``%RETRY%<group>`` and ``%DLQ%<group>`` are created with one queue (spec §10.1).

Reserved system topics (``SCHEDULE_TOPIC_XXXX``, the transaction topics, ...) are *valid names*: the
backend stores into them because protocol handlers park delayed and half messages there. Refusing a
client's direct send to them is the handler's job; :func:`is_send_forbidden` says which.
"""

from __future__ import annotations

import functools
import re

from mqproxy.model.errors import IllegalTopic, QueueNotFound, TopicNotFound
from mqproxy.model.types import PERM_READ, PERM_WRITE, TopicConfig

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
LMQ_PREFIX = "%LMQ%"
LMQ_QUEUE_ID = 0
#: The auto-create template topic producers ask the route of (spec §10.1).
AUTO_CREATE_TEMPLATE_TOPIC = "TBW102"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
MAX_TOPIC_BYTES = 127
MAX_RETRY_TOPIC_BYTES = 255
MAX_QUEUE_COUNT = 1024
#: Every permission bit (RocketMQ ``PermName``: 8 priority, 4 read, 2 write, 1 inherit).
PERM_ALL = 15

#: Topics a client may not send to directly (broker answers NO_PERMISSION); handlers check this.
SEND_FORBIDDEN_TOPICS = frozenset(
    {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)

_LEGAL = re.compile(r"[%|a-zA-Z0-9_-]+")


def is_lmq(topic: str) -> bool:
    return topic.startswith(LMQ_PREFIX)


def is_retry_or_dlq(topic: str) -> bool:
    return topic.startswith(RETRY_PREFIX) or topic.startswith(DLQ_PREFIX)


def is_send_forbidden(topic: str) -> bool:
    """True for system topics a client must not send to directly (handlers answer NO_PERMISSION)."""
    return topic in SEND_FORBIDDEN_TOPICS


def validate_topic(topic: str) -> None:
    """Raise :class:`IllegalTopic` unless ``topic`` is a legal topic name (any use)."""
    if not isinstance(topic, str) or not topic:
        raise IllegalTopic("topic name is empty")
    if _LEGAL.fullmatch(topic) is None:
        raise IllegalTopic(f"topic {topic[:64]!r} has characters outside [%|a-zA-Z0-9_-]")
    limit = MAX_RETRY_TOPIC_BYTES if is_retry_or_dlq(topic) else MAX_TOPIC_BYTES
    if len(topic) > limit:  # all legal characters are ASCII: len == byte length
        raise IllegalTopic(f"topic name is {len(topic)} bytes, limit {limit}")


def validate_send_topic(topic: str) -> None:
    """:func:`validate_topic` plus the 127-byte limit every stored message's topic obeys."""
    if type(topic) is not str:
        validate_topic(topic)  # raises for any non-string
    _check_send_topic(topic)


def validate_lmq(name: str) -> None:
    """Raise :class:`IllegalTopic` unless ``name`` is a legal ``%LMQ%`` queue name."""
    if type(name) is not str:
        validate_topic(name)  # raises for any non-string
    _check_lmq(name)


# Every send checks its topic and each dispatch target; the same few thousand names recur, so legal ones
# are remembered (a refusal raises, and exceptions are never cached).
@functools.lru_cache(maxsize=16384)
def _check_send_topic(topic: str) -> None:
    validate_topic(topic)
    if len(topic) > MAX_TOPIC_BYTES:
        raise IllegalTopic(f"cannot store into a topic longer than {MAX_TOPIC_BYTES} bytes")


@functools.lru_cache(maxsize=16384)
def _check_lmq(name: str) -> None:
    _check_send_topic(name)
    if not is_lmq(name) or len(name) == len(LMQ_PREFIX):
        raise IllegalTopic(f"dispatch target {name[:64]!r} is not a %LMQ% name")


def default_queue_count(topic: str, configured_default: int) -> int:
    """Queues a topic gets when created without an explicit count."""
    if is_retry_or_dlq(topic) or is_lmq(topic):
        return 1
    return configured_default


def lmq_config(topic: str) -> TopicConfig:
    return TopicConfig(topic, read_queues=1, write_queues=1)


class TopicTable:
    """Topic configs by name (ordinary topics only; LMQs are implicit). Pure bookkeeping, no I/O.

    ``default_queue_count`` applies to ordinary topics created without a count; ``auto_create`` says
    whether a backend may create a topic on its first send.
    """

    def __init__(self, default_queue_count: int, auto_create: bool) -> None:
        if not 1 <= default_queue_count <= MAX_QUEUE_COUNT:
            raise ValueError(f"default_queue_count must be in 1..{MAX_QUEUE_COUNT}")
        self.default_queue_count = default_queue_count
        self.auto_create = auto_create
        self._topics: dict[str, TopicConfig] = {}
        self._round_robin: dict[str, int] = {}

    def get(self, topic: str) -> TopicConfig | None:
        if is_lmq(topic):
            return lmq_config(topic)
        return self._topics.get(topic)

    def load(self, config: TopicConfig) -> None:
        """Install a config read back from storage."""
        self._topics[config.name] = config

    def plan_create(self, topic: str, queue_count: int | None) -> TopicConfig | None:
        """The config to create for ``topic``, or None if it already exists (idempotent create).

        Validates the name and the count; the caller persists the result then calls :meth:`load`.
        """
        validate_topic(topic)
        existing = self.get(topic)
        if existing is not None:
            return None
        count = default_queue_count(topic, self.default_queue_count) if queue_count is None else queue_count
        if not 1 <= count <= MAX_QUEUE_COUNT:
            raise IllegalTopic(f"queue count {count} outside 1..{MAX_QUEUE_COUNT}")
        return TopicConfig(topic, read_queues=count, write_queues=count, perm=PERM_READ | PERM_WRITE)

    def plan_update(self, config: TopicConfig) -> TopicConfig:
        """Validate an admin's create-or-update of an ordinary topic; the caller persists the result then
        calls :meth:`load`. Queue counts may be 0 (no queue readable, or writable) but not both."""
        validate_topic(config.name)
        if is_lmq(config.name):
            raise IllegalTopic(f"{config.name[:64]!r} is a light message queue: it has no config")
        for what, count in (("read", config.read_queues), ("write", config.write_queues)):
            if not 0 <= count <= MAX_QUEUE_COUNT:
                raise IllegalTopic(f"{what} queue count {count} outside 0..{MAX_QUEUE_COUNT}")
        if config.read_queues == config.write_queues == 0:
            raise IllegalTopic("a topic needs at least one queue")
        if not 0 <= config.perm <= PERM_ALL:
            raise IllegalTopic(f"perm {config.perm} is not a combination of 8, 4, 2 and 1")
        return config

    def require(self, topic: str) -> TopicConfig:
        """The existing config of a topic to read from; raises TopicNotFound/IllegalTopic."""
        config = self._topics.get(topic)  # stored names were validated when created
        if config is not None:
            return config
        validate_topic(topic)
        if is_lmq(topic):
            return lmq_config(topic)
        raise TopicNotFound(topic)

    def pick_queue(self, config: TopicConfig, queue_id: int) -> int:
        """Resolve a send's queue id: -1 picks round-robin; others must be a writable queue."""
        if queue_id < 0:
            if config.write_queues < 1:
                raise QueueNotFound(f"{config.name} has no writable queue")
            n = self._round_robin.get(config.name, 0)
            self._round_robin[config.name] = n + 1
            return n % config.write_queues
        if queue_id >= max(config.write_queues, config.read_queues):
            raise QueueNotFound(f"{config.name} has no queue {queue_id}")
        return queue_id

    @staticmethod
    def check_read_queue(config: TopicConfig, queue_id: int) -> None:
        if not 0 <= queue_id < max(config.read_queues, config.write_queues):
            raise QueueNotFound(f"{config.name} has no queue {queue_id}")

    def names(self) -> list[str]:
        return sorted(self._topics)
