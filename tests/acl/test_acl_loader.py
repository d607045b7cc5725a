"""Reading the account file and noticing changes (mqproxy.acl.loader), and the reload watcher's task."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.acl.loader import load_acl_file, stamp_of
from mqproxy.acl.rules import AclFileError
from mqproxy.acl_watch import initial_rules, watch_acl_file
from mqproxy.settings import AclSettings, SettingsError

from ..conftest import wait_until  # type: ignore[import-not-found]

GOOD = "accounts:\n  - accessKey: a\n    secretKey: s\n"


def test_load_and_stamp(tmp_path: Path) -> None:
    path = tmp_path / "acl.yml"
    assert stamp_of(str(path)) is None
    path.write_text(GOOD)
    first = stamp_of(str(path))
    assert first is not None
    assert set(load_acl_file(str(path)).accounts) == {"a"}
    os.utime(path, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    assert stamp_of(str(path)) != first


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(AclFileError, match="cannot read") as missing:
        load_acl_file(str(tmp_path / "nope.yml"))
    assert missing.value.line is None
    latin = tmp_path / "latin.yml"
    latin.write_bytes(b"accounts:\n  - accessKey: \xe9\n")
    with pytest.raises(AclFileError, match="not UTF-8"):
        load_acl_file(str(latin))


def test_initial_rules(tmp_path: Path) -> None:
    assert initial_rules(AclSettings()) == (None, None)
    path = tmp_path / "acl.yml"
    path.write_text("accounts:\n  - accessKey: a\n")
    with pytest.raises(SettingsError, match=rf"acl.file: {path}:2: account 'a' has no secretKey"):
        initial_rules(AclSettings(file=str(path)))


async def test_watcher_reloads_and_keeps_rules_when_the_file_goes(tmp_path: Path, log_sink: Any) -> None:
    path = tmp_path / "acl.yml"
    path.write_text(GOOD)
    settings = AclSettings(file=str(path), reload_interval_s=0.05)
    rules, stamp = initial_rules(settings)
    holder = AclHolder(rules, clock=lambda: 0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_acl_file, settings, holder, stamp)
        path.unlink()
        await wait_until(lambda: len(log_sink.named("acl.reload_failed")) == 1)
        assert log_sink.named("acl.reload_failed")[0]["line"] is None
        assert holder.rules is rules
        path.write_text(GOOD.replace("accessKey: a", "accessKey: b"))
        await wait_until(lambda: len(log_sink.named("acl.reloaded")) == 1)
        assert holder.rules is not None
        assert set(holder.rules.accounts) == {"b"}
        assert holder.generation == 1
        nursery.cancel_scope.cancel()
