"""The SRE notebook runs headless on the shared batch output and draws the report's charts."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_notebook_executes_and_draws_the_report_charts(
    batch_run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    source = resources.files("mqproxy.spark_etl") / "notebooks" / "sre_overview.ipynb"
    notebook = nbformat.reads(source.read_text(encoding="utf-8"), as_version=4)
    # The kernel is a separate process with its own (small, fast-starting) Spark driver.
    monkeypatch.setenv("MQPROXY_ETL_TABLES", str(batch_run.output))
    monkeypatch.setenv("MQPROXY_ETL_MASTER", "local[1]")
    monkeypatch.setenv("MQPROXY_ETL_FAST_JVM", "1")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(images) == 5, "throughput, latency, errors, protocol mix, replication delay"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "protocols:" in text
    assert "7 malformed lines quarantined" in text
    assert "23:57 grpc p99 latency" in text
    assert "edge->central:Orders" in text
