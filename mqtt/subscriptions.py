"""The wildcard subscription index: which subscribed filters match a topic name.

A trie over topic levels; each node has exact-level children plus one ``+`` and one ``#`` child. A match
walks one path per ``+``/exact branch, so its cost depends on the topic's depth and the number of
*matching* branches, not on the number of filters (100,000 filters: see tests and the report). Filters are
reference-counted: each subscriber adds once and removes once.

[MQTT-4.7.2-1]: a filter starting with ``+`` or ``#`` never matches a topic starting with ``$``.
"""

from __future__ import annotations


class _Node:
    __slots__ = ("children", "count", "filter", "hash", "plus")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.filter: str | None = None  # set on the node that ends a subscribed filter
        self.count = 0

    def empty(self) -> bool:
        return not self.children and self.plus is None and self.hash is None and self.count == 0


class SubscriptionIndex:
    """Reference-counted set of topic filters with fast topic → matching-filters lookup. ``version`` grows
    whenever the set of distinct filters changes (a first add, a last remove), so a caller may keep
    what :meth:`match` answered for as long as ``version`` stays the same."""

    def __init__(self) -> None:
        self._root = _Node()
        self._size = 0
        self.version = 0

    def __len__(self) -> int:
        """Number of distinct filters."""
        return self._size

    def add(self, topic_filter: str) -> None:
        node = self._root
        for level in topic_filter.split("/"):
            if level == "+":
                if node.plus is None:
                    node.plus = _Node()
                node = node.plus
            elif level == "#":
                if node.hash is None:
                    node.hash = _Node()
                node = node.hash
            else:
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _Node()
                node = child
        if node.count == 0:
            self._size += 1
            self.version += 1
            node.filter = topic_filter
        node.count += 1

    def remove(self, topic_filter: str) -> bool:
        """Drop one reference; True if the filter was present."""
        path: list[tuple[_Node, str]] = []
        node: _Node | None = self._root
        for level in topic_filter.split("/"):
            assert node is not None
            path.append((node, level))
            node = node.plus if level == "+" else node.hash if level == "#" else node.children.get(level)
            if node is None:
                return False
        if node is None or node.count == 0:
            return False
        node.count -= 1
        if node.count:
            return True
        node.filter = None
        self._size -= 1
        self.version += 1
        for parent, level in reversed(path):
            if not node.empty():
                break
            if level == "+":
                parent.plus = None
            elif level == "#":
                parent.hash = None
            else:
                del parent.children[level]
            node = parent
        return True

    def __contains__(self, topic_filter: object) -> bool:
        if not isinstance(topic_filter, str):
            return False
        node: _Node | None = self._root
        for level in topic_filter.split("/"):
            assert node is not None
            node = node.plus if level == "+" else node.hash if level == "#" else node.children.get(level)
            if node is None:
                return False
        return node is not None and node.count > 0

    def match(self, topic: str) -> list[str]:
        """Every subscribed filter matching the topic name ``topic`` (each once)."""
        levels = topic.split("/")
        last = len(levels)
        out: list[str] = []
        dollar = topic.startswith("$")
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            hash_node = node.hash
            if hash_node is not None and hash_node.count and not (dollar and depth == 0):
                out.append(hash_node.filter)  # type: ignore[arg-type]
            if depth == last:
                if node.count:
                    out.append(node.filter)  # type: ignore[arg-type]
                continue
            child = node.children.get(levels[depth])
            if child is not None:
                stack.append((child, depth + 1))
            plus = node.plus
            if plus is not None and not (dollar and depth == 0):
                stack.append((plus, depth + 1))
        return out
