"""Server-side queue allocation as a Java broker's QueryAssignmentProcessor does it."""

from __future__ import annotations

import pytest

from mqproxy.backends.embedded.assignment import allocate, assign, effective_mode
from mqproxy.facade.types import RequestMode


@pytest.mark.parametrize(
    ("queues", "clients", "expected"),
    [
        (8, 3, {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}),
        (4, 2, {"a": [0, 1], "b": [2, 3]}),
        (2, 3, {"a": [0], "b": [1], "c": []}),
        (5, 5, {c: [i] for i, c in enumerate("abcde")}),
    ],
)
def test_average(queues: int, clients: int, expected: dict[str, list[int]]) -> None:
    ids = [chr(ord("a") + i) for i in range(clients)]
    assert {c: allocate("AVG", c, list(range(queues)), ids) for c in ids} == expected


def test_average_by_circle() -> None:
    assert allocate("AVG_BY_CIRCLE", "b", list(range(8)), ["a", "b", "c"]) == [1, 4, 7]


def test_pop_modes() -> None:
    queues, clients = list(range(4)), ["a", "b", "c", "d"]
    assert assign(mode=RequestMode("POP", 0), strategy="AVG", client_id="a", queues=queues, clients=clients,
                  broadcasting=False) == [-1]  # fmt: skip
    # share 1 with four clients: its own queue and the next client's
    assert assign(mode=RequestMode("POP", 1), strategy="AVG", client_id="a", queues=queues, clients=clients,
                  broadcasting=False) == [0, 1]  # fmt: skip
    assert assign(mode=RequestMode("PULL"), strategy="nope", client_id="a", queues=queues, clients=clients,
                  broadcasting=False) is None  # fmt: skip
    assert assign(mode=RequestMode("PULL"), strategy="AVG", client_id="a", queues=queues, clients=clients,
                  broadcasting=True) == queues  # fmt: skip


def test_effective_mode() -> None:
    assert effective_mode("%RETRY%G", None) == RequestMode("PULL")
    assert effective_mode("T", None) == RequestMode("PULL")
    assert effective_mode("T", RequestMode("POP", 3)) == RequestMode("POP", 3)
