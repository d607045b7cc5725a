"""Key-based compaction of state queues: see :mod:`mqproxy.facade.compaction` (re-exported here)."""

from mqproxy.facade.compaction import (
    KeyOf,
    QueueLog,
    Replay,
    compact,
    compact_if_worth,
    replay,
    worth_compacting,
)

__all__ = ["KeyOf", "QueueLog", "Replay", "compact", "compact_if_worth", "replay", "worth_compacting"]
