"""The stock-RocketMQ launcher (scripts/stock_rocketmq.py and its JVM processes): one-line failures and
nothing left behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import jvm_processes  # noqa: E402
import stock_rocketmq  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


@pytest.mark.e2e
def test_a_jvm_that_fails_is_reported_in_one_line_and_reaped(tmp_path: Path) -> None:
    cp = stock_rocketmq.classpath("server")
    proc = stock_rocketmq.JavaProcess(
        "bogus",
        stock_rocketmq.jvm_argv(cp, "org.example.NoSuchMain", [], home=tmp_path),
        tmp_path / "bogus.log",
        "never",
        stock_rocketmq.free_port(),
        tmp_path,
    )
    proc.start()
    pid = proc.proc.pid  # type: ignore[union-attr]
    with pytest.raises(stock_rocketmq.LauncherError) as info:
        proc.wait_ready(timeout=60)
    message = str(info.value)
    assert "\n" not in message
    assert "bogus exited with 1" in message
    assert "NoSuchMain" in message
    proc.stop()
    assert not _alive(pid)


@pytest.mark.e2e
def test_a_port_taken_is_named(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home = tmp_path / "ns"
        home.mkdir()
        proc = stock_rocketmq.namesrv_jvm(stock_rocketmq.classpath("server"), home, port)
        proc.start()
        with pytest.raises(stock_rocketmq.LauncherError, match=r"port|Address already in use|exited"):
            proc.wait_ready(timeout=60)
        proc.stop()


@pytest.mark.e2e
def test_cluster_starts_serves_admin_and_stops_every_process(tmp_path: Path) -> None:
    cluster = stock_rocketmq.StockCluster(tmp_path, brokers=2, cluster_name="LauncherTest")
    with cluster:
        pids = [cluster.namesrv_process.proc.pid]  # type: ignore[union-attr]
        pids += [b.process.proc.pid for b in cluster.broker_list]  # type: ignore[union-attr]
        listed = cluster.mqadmin("clusterList")
        assert listed.returncode == 0, listed.stderr
        assert "broker-a" in listed.stdout
        assert "broker-b" in listed.stdout
        assert "LauncherTest" in listed.stdout
        created = cluster.mqadmin(
            "updateTopic", "-c", "LauncherTest", "-t", "LauncherTopic", "-r", "4", "-w", "4"
        )
        assert created.returncode == 0, created.stdout + created.stderr
        cluster.wait_route("LauncherTopic")
        # a broker stopped and started again keeps its address
        addr = cluster.broker("broker-b").addr
        cluster.stop_broker("broker-b", kill=True)
        assert not cluster.broker("broker-b").process.running
        assert cluster.restart_broker("broker-b").addr == addr
        pids.append(cluster.broker("broker-b").process.proc.pid)  # type: ignore[union-attr]
        assert all(_alive(p) for p in pids[:2])
    assert not any(_alive(p) for p in pids)
    # logs land in the work directory
    assert (tmp_path / "namesrv" / "namesrv.log").read_text().count("boot success") == 1


@pytest.mark.e2e
def test_a_failed_start_leaves_nothing_behind(tmp_path: Path) -> None:
    others = set(jvm_processes._LIVE)  # JVMs of session fixtures that are still up
    cluster = stock_rocketmq.StockCluster(tmp_path, brokers=1, broker_heap_mb=1)  # the broker's JVM refuses
    with pytest.raises(stock_rocketmq.LauncherError) as info:
        cluster.start()
    assert str(info.value).startswith("broker broker-a exited with 1 before it was ready: ")
    assert "heap" in str(info.value)
    assert cluster.namesrv_process is not None
    assert not cluster.namesrv_process.running
    assert set(jvm_processes._LIVE) <= others  # nothing this cluster started is left
