"""Failed-authentication back-off (sans-IO, explicit clock)."""

from __future__ import annotations

import pytest

from mqproxy.acl.throttle import AuthThrottle


def test_free_failures_then_doubling_up_to_cap() -> None:
    throttle = AuthThrottle(free_failures=2, base_delay=0.5, max_delay=2.0, forget_after=100.0)
    now = 10.0
    delays = []
    for _ in range(6):
        throttle.failed("1.2.3.4", now)
        delays.append(throttle.delay_for("1.2.3.4", now))
    assert delays == [0.0, 0.0, 0.5, 1.0, 2.0, 2.0]
    assert throttle.delay_for("1.2.3.4", now + 1.5) == pytest.approx(0.5)
    assert throttle.delay_for("1.2.3.4", now + 3.0) == 0.0
    assert throttle.delay_for("5.6.7.8", now) == 0.0


def test_success_and_quiet_time_forget() -> None:
    throttle = AuthThrottle(free_failures=0, base_delay=1.0, forget_after=30.0)
    throttle.failed("a", 0.0)
    assert throttle.delay_for("a", 0.0) == 1.0
    throttle.succeeded("a")
    assert throttle.delay_for("a", 0.0) == 0.0
    throttle.failed("b", 0.0)
    throttle.failed("b", 0.0)
    assert throttle.delay_for("b", 0.0) == 2.0
    # After forget_after the count starts again.
    throttle.failed("b", 40.0)
    assert throttle.delay_for("b", 40.0) == 1.0
    assert throttle.delay_for("b", 80.0) == 0.0
    assert len(throttle) == 0


def test_memory_is_bounded() -> None:
    throttle = AuthThrottle(free_failures=0, max_addresses=100)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", float(i))
    assert len(throttle) == 100
    assert throttle.delay_for("10.0.0.0", 999.0) == 0.0
    assert throttle.delay_for("10.0.3.231", 999.0) > 0.0
