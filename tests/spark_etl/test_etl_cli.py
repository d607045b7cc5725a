"""``mqproxy-etl`` in-process (it reuses the test session and leaves it running)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.cli import build_parser, main

pytestmark = pytest.mark.spark


def test_every_command_takes_a_master_url() -> None:
    parser = build_parser()
    for argv in (
        ["batch", "--input", "i", "--output", "o"],
        ["stream", "--input", "i", "--output", "o", "--checkpoint", "c"],
        ["report", "--input", "i", "--output", "r.html"],
    ):
        assert parser.parse_args(argv).master == "local[*]"
        assert (
            parser.parse_args([*argv, "--master", "spark://10.0.0.9:7077"]).master == "spark://10.0.0.9:7077"
        )


def test_batch_on_one_file_twice_replaces_rather_than_appends(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "proxy.log"
    events = list(synthetic.iter_events(25, synthetic.CorpusOptions(span=timedelta(minutes=3), seed=21)))
    synthetic.write_jsonl(log, events, synthetic.MALFORMED_LINES[:1])
    argv = ["batch", "--input", str(log), "--output", str(tmp_path / "t"), "--master", "local[2]"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert (first["valid_events"], first["malformed"]) == (len(events), 1)
    assert first["table_rows"] == second["table_rows"]
    rollup = spark.read.parquet(str(tmp_path / "t" / "rollup_minute")).collect()
    assert (
        len(rollup) == second["table_rows"]["rollup_minute"] == len(synthetic.expected_minute_rollup(events))
    )
    assert not spark.sparkContext._jsc.sc().isStopped(), "the CLI must not stop a session it did not start"


def test_job_failure_is_one_line_and_status_1(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "report",
            "--input",
            str(tmp_path / "nothing"),
            "--output",
            str(tmp_path / "r.html"),
            "--master",
            "local[2]",
        ]
    )
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("mqproxy-etl report: FileNotFoundError")
    assert err.count("\n") == 1


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["batch", "--input", "x"])
    assert exc.value.code == 2
    assert main(["batch", "--input", "x", "--output", "y", "--top-clients", "0"]) == 2
    assert "--top-clients" in capsys.readouterr().err


def test_batch_cache_dir_is_filled_then_reused(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "proxy.log"
    events = list(synthetic.iter_events(20, synthetic.CorpusOptions(span=timedelta(minutes=2), seed=5)))
    synthetic.write_jsonl(log, events)
    argv = ["batch", "--input", str(log), "--output", str(tmp_path / "t"), "--master", "local[2]"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["input_cache"] == {"reused": 0, "staged": 1, "rows_staged": len(events), "pruned": 0}
    assert second["input_cache"] == {"reused": 1, "staged": 0, "rows_staged": 0, "pruned": 0}
    assert first["table_rows"] == second["table_rows"]
    assert any((tmp_path / "cache").iterdir())
