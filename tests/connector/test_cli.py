"""``mqproxy connect`` as a command: exit status 2 for a bad rules file, /metrics, SIGTERM → exit 0."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import trio

from .conftest import ConnectProcess, Node, produce, read_all, rules_text


def test_bad_rules_file_exits_2_naming_file_line_and_field(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[connector]\nname = "c"\n[clusters.a]\nnamesrv = "x:1"\n[clusters.b]\nnamesrv = "y:2"\n'
        '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "T"\nstart = "yesterday"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "mqproxy", "connect", "--config", str(rules)], capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert f"{rules}:11: rules[0].start:" in done.stderr.decode()
    missing = subprocess.run(
        [sys.executable, "-m", "mqproxy", "connect", "--config", str(tmp_path / "no.toml")],
        capture_output=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "no.toml" in missing.stderr.decode()


def test_metrics_and_sigterm_exit_0(two_nodes: tuple[Node, Node], tmp_path: Path) -> None:
    a, b = two_nodes
    trio.run(produce, a.addr, "M", 12)
    rules = tmp_path / "rules.toml"
    rules.write_text(
        rules_text(a.addr, b.addr, '[[rules]]\nsource = "a"\ntarget = "b"\ntopic = "M"\nstart = "earliest"\n')
    )
    proc = ConnectProcess(rules, tmp_path / "connect.log", "--metrics", "127.0.0.1:0")
    try:
        listen = proc.wait_started()["listen"]

        def copied() -> bool:
            return sum(e["messages"] for e in proc.events("connector.batch")) >= 12

        from ..conftest import wait_until_sync  # type: ignore[import-not-found]

        wait_until_sync(copied)
        body = urllib.request.urlopen(f"http://{listen}/metrics", timeout=10).read().decode()
        rule = 'rule="a->b:M"'
        assert f"mqproxy_connector_messages_total{{{rule}}} 12.0" in body
        assert "mqproxy_connector_replication_delay_seconds_bucket" in body
        assert "mqproxy_connector_last_copied_timestamp_seconds" in body
        assert proc.terminate() == 0
        assert proc.events("connector.stopped")[-1]["reason"] == "SIGTERM"
    finally:
        proc.close()
    assert Counter(m.properties["seq"] for m in trio.run(read_all, b.addr, "M")) == Counter(
        str(n) for n in range(12)
    )
