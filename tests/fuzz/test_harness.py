"""The fuzz harness itself (quick tier): deterministic inputs, valid seeds, and each kind of finding
(crash, hang, leak) detected and minimised on planted bugs."""

from __future__ import annotations

import random

import pytest

from mqproxy.fuzz import runner
from mqproxy.fuzz.mutator import Field, Mutator, Seed, varint
from mqproxy.fuzz.runner import Finding, FuzzSettings, fuzz, minimize, run_chunk
from mqproxy.fuzz.targets import TARGETS, Target


def test_mutator_is_deterministic_and_bounded() -> None:
    seeds = [Seed(b"\x00\x00\x00\x10" + bytes(range(16)), (Field(0, 4),)),
             Seed(b"\x30\x05abcde", (Field(1, 1, True),))]
    first = [Mutator(random.Random(7), seeds, max_len=64).mutate() for _ in range(1)]
    a, b = Mutator(random.Random(7), seeds, max_len=64), Mutator(random.Random(7), seeds, max_len=64)
    out_a = [a.mutate() for _ in range(2000)]
    assert out_a == [b.mutate() for _ in range(2000)]
    assert out_a[0] == first[0]
    assert max(len(x) for x in out_a) <= 64
    assert len(set(out_a)) > 1200  # mostly distinct inputs, even from two tiny seeds
    assert varint(321) == b"\xc1\x02"


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_seed_decodes_cleanly(name: str) -> None:
    """A seed that already fails would make its mutants meaningless."""
    target = TARGETS[name]
    seeds = target.seeds()
    assert len(seeds) >= 4
    for seed in seeds:
        target.run(seed.data, 0)
        for field in seed.fields:
            assert field.offset + field.width <= len(seed.data)


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_small_run_of_each_target_is_clean(name: str) -> None:
    result = run_chunk((name, 3, 0, 1000, FuzzSettings(leak_window=300)))
    assert result.inputs == 1000
    assert result.findings == []


def _planted(data: bytes, split: int) -> None:
    if b"\xde\xad" in data:
        raise IndexError("planted")
    if b"\xbe\xef" in data:
        while True:
            pass
    if data:
        raise ValueError("documented")


_LEAKED: list[bytes] = []


def _leaky(data: bytes, split: int) -> None:
    _LEAKED.append(bytes(1024))


def _target(run: object, name: str = "planted") -> Target:
    seeds = [Seed(b"\x00\x01\x02\x03\xde\xad\x04\x05"), Seed(b"\x10\x11\x12\xbe\xef\x13")]
    return Target(name, "planted bugs", run, (ValueError,), lambda: seeds)  # type: ignore[arg-type]


def test_crash_and_hang_are_found_and_minimised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "TARGETS", {"planted": _target(_planted)})
    runner._SEED_CACHE.pop("planted", None)
    reports, _ = fuzz(["planted"], FuzzSettings(inputs=100, workers=1, chunk=100, input_cap_s=0.02))
    kinds = {f.kind: f for f in reports[0].findings}
    assert kinds["crash"].key.startswith("IndexError at test_harness.py:")
    assert kinds["crash"].data == b"\xde\xad"  # minimised to the two bytes that matter
    assert kinds["hang"].data == b"\xbe\xef"


def test_leak_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "TARGETS", {"leaky": _target(_leaky, "leaky")})
    runner._SEED_CACHE.pop("leaky", None)
    result = run_chunk(("leaky", 1, 0, 400, FuzzSettings(leak_window=200, leak_bytes=64 * 1024)))
    assert [f.kind for f in result.findings] == ["leak"]
    _LEAKED.clear()


def test_minimize_keeps_an_input_that_no_longer_reproduces() -> None:
    finding = Finding("planted", "crash", "NoSuchError at nowhere:1", b"\x01\x02", 0)
    assert minimize(_target(_planted), finding).data == b"\x01\x02"


def test_an_outer_interval_timer_survives_the_per_input_cap() -> None:
    """pytest-timeout arms SIGALRM too: the harness hands back what is left of it."""
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        runner.run_with_cap(lambda data, split: None, b"", 0, 1.0)
        result = run_chunk(("sniff", 1, 0, 50, FuzzSettings(leak_window=10)))
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert signal.getsignal(signal.SIGALRM) is not runner._on_alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert result.findings == []
    assert 25.0 < left <= 30.0
    assert fired == []
