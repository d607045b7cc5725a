"""Fuzz tier: the campaign itself, every codec target with ``MQFUZZ_INPUTS`` inputs (default 10^6) on two
worker processes. Each input must decode or raise the codec's documented error; a crash, a hang past the
per-input cap or memory retained by the leak window fails the test with the minimised inputs."""

from __future__ import annotations

import os

import pytest

from mqproxy.fuzz.runner import FuzzSettings, RssTracker, fuzz
from mqproxy.fuzz.targets import TARGETS

pytestmark = pytest.mark.fuzz

INPUTS = int(os.environ.get("MQFUZZ_INPUTS", "1000000"))


@pytest.mark.timeout(7200)
def test_every_codec_survives_the_campaign(capsys: pytest.CaptureFixture[str]) -> None:
    rss = RssTracker()
    reports, wall = fuzz(TARGETS, FuzzSettings(inputs=INPUTS, workers=2), rss)
    with capsys.disabled():
        for r in reports:
            print(f"\n[fuzz] {r.target}: {r.inputs} inputs, {r.per_core_rate:.0f}/s per core, slowest "
                  f"{r.max_input_ms:.1f} ms, retained {r.max_retained_bytes} B, findings {len(r.findings)}")
        print(f"[fuzz] {sum(r.inputs for r in reports)} inputs in {wall:.0f} s wall, worker RSS growth "
              f"{rss.growth_kib} KiB")
    assert {r.target for r in reports} == set(TARGETS)
    assert all(r.inputs == INPUTS for r in reports)
    findings = [f"{f.target} {f.kind} {f.key}: input {f.data.hex()} split {f.split}"
                for r in reports for f in r.findings]
    assert findings == []
    assert rss.growth_kib < 64 * 1024  # no worker grows by 64 MiB once warm
