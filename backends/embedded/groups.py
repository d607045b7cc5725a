"""Consumer-group membership, kept in memory by every backend (clients re-announce it by heartbeat)."""

from __future__ import annotations

from mqproxy.model.types import ConsumerInfo


class ConsumerRegistry:
    """Live members of each consumer group, by client id."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, ConsumerInfo]] = {}

    def register(self, info: ConsumerInfo) -> bool:
        """Add or refresh ``info``; True if the group's set of client ids changed."""
        members = self._groups.setdefault(info.group, {})
        changed = info.client_id not in members
        members[info.client_id] = info
        return changed

    def unregister(self, group: str, client_id: str) -> bool:
        members = self._groups.get(group)
        if members is None or client_id not in members:
            return False
        del members[client_id]
        if not members:
            del self._groups[group]
        return True

    def ids(self, group: str) -> list[str]:
        return sorted(self._groups.get(group, ()))

    def groups(self) -> list[str]:
        """Groups with at least one live member, sorted."""
        return sorted(self._groups)

    def info(self, group: str, client_id: str) -> ConsumerInfo | None:
        return self._groups.get(group, {}).get(client_id)
