"""
mqproxy.remoting.registry
~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`ConnectionRegistry`: which remoting connection each consumer-group member and each announced
producer group lives on, server-wide. Pure bookkeeping (no I/O): notifications and check-backs are
queued on the connections (:class:`GroupPeer`) for their I/O layer to deliver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mqproxy.facade.types import TransactionCheck

__all__ = ["ConnectionRegistry", "GroupPeer"]


class GroupPeer(Protocol):
    """A connection the registry can notify."""

    def notify_consumer_ids_changed(self, group: str) -> None: ...

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        """Queue CHECK_TRANSACTION_STATE (oneway) for ``check``; False if the connection is gone."""
        ...


class ConnectionRegistry:
    """Consumer groups -> the connections their members live on, producer groups -> the connections
    that announced them; a :class:`~mqproxy.remoting.context.GroupMembership` for :class:`ServerContext`.

    Each (group, client id) is owned by the connection that last heartbeated it, so a client that
    reconnected is not unregistered when its old connection is finally noticed dead.

    :meth:`check_transaction` is a :data:`~mqproxy.facade.types.CheckBack`: pass it to
    :meth:`~mqproxy.facade.api.Producing.add_check_back`.
    """

    def __init__(self) -> None:
        self._owners: dict[tuple[str, str], GroupPeer] = {}
        #: group -> {connection: number of the group's client ids it owns}
        self._groups: dict[str, dict[GroupPeer, int]] = {}
        #: producer group -> connections, most recently announced last
        self._producers: dict[str, dict[GroupPeer, None]] = {}

    def join_producer(self, group: str, conn: object) -> None:
        peers = self._producers.setdefault(group, {})
        peers.pop(conn, None)  # type: ignore[call-overload]
        peers[conn] = None  # type: ignore[index]

    def leave_producer(self, group: str, conn: object) -> bool:
        peers = self._producers.get(group)
        if peers is None or conn not in peers:
            return False
        peers.pop(conn, None)  # type: ignore[call-overload]
        if not peers:
            del self._producers[group]
            return True
        return False

    def producers(self, group: str) -> list[GroupPeer]:
        return list(self._producers.get(group, ()))

    async def check_transaction(self, check: TransactionCheck) -> bool:
        """Send CHECK_TRANSACTION_STATE to the most recently announced live producer connection of
        ``check.producer_group``; False when none is online (the checker simply tries again later)."""
        for peer in reversed(self.producers(check.producer_group)):
            if peer.check_transaction_state(check):
                return True
        return False

    def join(self, group: str, client_id: str, conn: object) -> None:
        peer: GroupPeer = conn  # type: ignore[assignment]
        key = (group, client_id)
        previous = self._owners.get(key)
        if previous is peer:
            return
        if previous is not None:
            self._release(group, previous)
        self._owners[key] = peer
        members = self._groups.setdefault(group, {})
        members[peer] = members.get(peer, 0) + 1

    def leave(self, group: str, client_id: str, conn: object) -> bool:
        key = (group, client_id)
        if self._owners.get(key) is not conn:
            return False
        del self._owners[key]
        self._release(group, conn)  # type: ignore[arg-type]
        return True

    def notify_changed(self, group: str, exclude: object | None) -> None:
        for peer in list(self._groups.get(group, ())):
            if peer is not exclude:
                peer.notify_consumer_ids_changed(group)

    def connections(self, group: str) -> list[GroupPeer]:
        return list(self._groups.get(group, ()))

    def owner(self, group: str, client_id: str) -> GroupPeer | None:
        """The connection that last heartbeated ``client_id`` into consumer ``group``, if still joined."""
        return self._owners.get((group, client_id))

    def _release(self, group: str, peer: GroupPeer) -> None:
        members = self._groups.get(group)
        if members is None or peer not in members:
            return
        members[peer] -= 1
        if members[peer] <= 0:
            del members[peer]
        if not members:
            del self._groups[group]
