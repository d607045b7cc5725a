"""The ``mqproxy serve`` process freezes its start-up heap (gc.freeze) so later full collections skip it;
a server run inside another program (these tests, an embedding application) does not."""

from __future__ import annotations

import gc
import sys
from typing import Any

import trio

from mqproxy import cli
from mqproxy.server import freeze_startup_heap, serve
from mqproxy.settings import Settings


def test_freeze_startup_heap_moves_the_live_objects_to_the_permanent_generation() -> None:
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count()
        assert frozen > 1000  # at least the modules imported for these tests
        assert gc.get_count()[0] < 100  # collected, nothing young left behind
    finally:
        gc.unfreeze()


async def test_serve_freezes_the_heap_only_when_asked(log_sink: Any) -> None:
    for freeze in (False, True):
        assert gc.get_freeze_count() == 0
        try:
            async with trio.open_nursery() as nursery:
                handle = await nursery.start(
                    lambda task_status, freeze=freeze: serve(
                        Settings.for_tests(),
                        install_signal_handlers=False,
                        freeze_heap=freeze,
                        task_status=task_status,
                    )
                )
                assert (gc.get_freeze_count() > 0) is freeze
                handle.stop("test")
        finally:
            gc.unfreeze()


def test_the_cli_serves_with_a_frozen_heap(monkeypatch: Any, tmp_path: Any) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(cli.trio, "run", lambda fn, *args: ran.append(fn))
    monkeypatch.setattr(cli, "configure_logging", lambda settings: sys.stderr)  # leave logging alone
    assert cli.main(["serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path)]) == 0
    assert len(ran) == 1
    assert ran[0].func is serve
    assert ran[0].keywords == {"freeze_heap": True}
