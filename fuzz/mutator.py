"""
mqproxy.fuzz.mutator
~~~~~~~~~~~~~~~~~~~~

A small deterministic, structure-aware byte mutator.

A :class:`Seed` is a valid encoding plus the places of its length fields (``Field``: offset, width,
big-endian integer or MQTT variable byte integer). :meth:`Mutator.mutate` stacks one to four operations on
a seed: bit flips, interesting bytes, truncations, length-field lies (a declared length set to 0, 1, the
true value +-1, the field's maximum, ...), splices with another seed, duplicated/deleted/inserted ranges,
and now and then pure random bytes. Everything comes from one ``random.Random``, so a run is reproduced
from its seed alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Field", "Mutator", "Seed", "varint"]

#: Bytes that tend to sit on boundaries: zero, one, sign bits, all-ones, ASCII structure characters.
_INTERESTING_BYTES = (0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFE, 0xFF, 0x20, 0x22, 0x7B, 0x7D, 0x0A, 0x0D)


@dataclass(frozen=True, slots=True)
class Field:
    """A length (or count) field inside a seed: ``width`` bytes at ``offset``; ``varint`` for MQTT's
    variable byte integer (``width`` is then its encoded size)."""

    offset: int
    width: int
    varint: bool = False


@dataclass(frozen=True, slots=True)
class Seed:
    """One valid encoding; ``fields`` are its length fields (may be empty)."""

    data: bytes
    fields: tuple[Field, ...] = ()


def varint(value: int) -> bytes:
    """MQTT variable byte integer (values above 268435455 give 5 bytes: a deliberate lie)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Mutator:
    """Mutates seeds with a seeded ``random.Random``; ``max_len`` caps the result's size."""

    def __init__(self, rng: random.Random, seeds: Sequence[Seed], max_len: int = 4096) -> None:
        if not seeds:
            raise ValueError("at least one seed is needed")
        self._rng = rng
        self._seeds = seeds
        self._max_len = max_len
        self._ops: tuple[Callable[[bytearray, Seed], bytearray], ...] = (
            self._flip_bits, self._flip_bits, self._interesting_byte, self._truncate, self._length_lie,
            self._length_lie, self._length_lie, self._splice, self._insert_random, self._delete_range,
            self._duplicate_range, self._overwrite_random,
        )

    def mutate(self) -> bytes:
        """A new input: a mutated seed (about 2% are pure random bytes, 1% an unchanged seed)."""
        rng = self._rng
        roll = rng.random()
        if roll < 0.02:
            return rng.randbytes(rng.randrange(0, min(96, self._max_len + 1)))
        seed = self._seeds[rng.randrange(len(self._seeds))]
        data = bytearray(seed.data)
        if roll < 0.03:
            return bytes(data)
        for _ in range(1 + int(rng.random() ** 2 * 4)):
            data = self._ops[rng.randrange(len(self._ops))](data, seed)
        return bytes(data[: self._max_len])

    # --- operations --------------------------------------------------------------------------------
    def _pos(self, data: bytearray) -> int:
        return self._rng.randrange(len(data)) if data else 0

    def _flip_bits(self, data: bytearray, seed: Seed) -> bytearray:
        if data:
            for _ in range(1 + self._rng.randrange(3)):
                data[self._pos(data)] ^= 1 << self._rng.randrange(8)
        return data

    def _interesting_byte(self, data: bytearray, seed: Seed) -> bytearray:
        if data:
            data[self._pos(data)] = self._rng.choice(_INTERESTING_BYTES)
        return data

    def _truncate(self, data: bytearray, seed: Seed) -> bytearray:
        return data[: self._pos(data)]

    def _length_lie(self, data: bytearray, seed: Seed) -> bytearray:
        rng = self._rng
        if seed.fields and rng.random() < 0.85:
            field = rng.choice(seed.fields)
        elif data:
            field = Field(self._pos(data), rng.choice((1, 2, 4)))
        else:
            return data
        end = field.offset + field.width
        if end > len(data):
            return data
        true_value = int.from_bytes(data[field.offset : end], "big") if not field.varint else 0
        top = (1 << (7 * field.width)) - 1 if field.varint else (1 << (8 * field.width)) - 1
        value = rng.choice(
            (0, 1, 2, 3, 4, true_value - 1, true_value + 1, true_value * 2, top, top >> 1, (top >> 1) + 1,
             len(data), len(data) + 1, rng.randrange(top + 1))
        ) & top
        raw = varint(value) if field.varint else value.to_bytes(field.width, "big")
        data[field.offset : end] = raw
        return data

    def _splice(self, data: bytearray, seed: Seed) -> bytearray:
        other = self._rng.choice(self._seeds).data
        cut = self._pos(data)
        if self._rng.random() < 0.5:
            return data[:cut] + other[self._rng.randrange(len(other) + 1) :]
        start = self._rng.randrange(len(other) + 1)
        return data[:cut] + other[start : start + self._rng.randrange(1, 64)] + data[cut:]

    def _insert_random(self, data: bytearray, seed: Seed) -> bytearray:
        cut = self._pos(data)
        return data[:cut] + self._rng.randbytes(self._rng.randrange(1, 17)) + data[cut:]

    def _delete_range(self, data: bytearray, seed: Seed) -> bytearray:
        cut = self._pos(data)
        del data[cut : cut + self._rng.randrange(1, 17)]
        return data

    def _duplicate_range(self, data: bytearray, seed: Seed) -> bytearray:
        if not data:
            return data
        start = self._pos(data)
        chunk = data[start : start + self._rng.randrange(1, 65)]
        cut = self._pos(data)
        return data[:cut] + chunk * self._rng.randrange(1, 4) + data[cut:]

    def _overwrite_random(self, data: bytearray, seed: Seed) -> bytearray:
        if data:
            start = self._pos(data)
            size = self._rng.randrange(1, 9)
            data[start : start + size] = self._rng.randbytes(size)
        return data
