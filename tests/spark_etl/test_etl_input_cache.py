"""The batch's input cache: the same tables as without it, reuse of unchanged files, and
re-staging of files that grew or were rewritten."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from mqproxy.spark_etl import synthetic
from mqproxy.spark_etl.batch import QUARANTINE, TABLES, run_batch
from mqproxy.spark_etl.input_cache import STALE_TEMP_S, FileStamp, cacheable, list_input_files, prune

pytestmark = pytest.mark.spark


def _rows(spark: Any, directory: Path, name: str) -> list[tuple[Any, ...]]:
    frame = spark.read.parquet(str(directory / name))
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def _quarantine(spark: Any, directory: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.json(str(directory / QUARANTINE)).collect())


def test_list_input_files_skips_hidden_names_as_spark_does(tmp_path: Path) -> None:
    names = (
        "a.log",
        "sub/b.log",
        ".hidden",
        "_SUCCESS",
        "_tmp/c.log",
        ".git/d.log",
        "_d=1/e.log",
        "f._COPYING_",
    )
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    expected = [tmp_path / "_d=1" / "e.log", tmp_path / "a.log", tmp_path / "sub" / "b.log"]
    assert list_input_files(str(tmp_path)) == expected
    assert list_input_files(f"file:{tmp_path / 'a.log'}") == [tmp_path / "a.log"]


def test_only_existing_local_inputs_are_cached(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_bytes(b"")
    assert cacheable(str(tmp_path))
    assert cacheable(f"file://{tmp_path / 'a.log'}")
    assert not cacheable(str(tmp_path / "*.log")), "a glob is left to Spark"
    assert not cacheable("hdfs://namenode/logs")


def _entry(cache: Path, name: str, source: Path) -> Path:
    """A cache entry as staging leaves it (stamp and data folder), for ``source``."""
    entry = cache / name
    (entry / "data").mkdir(parents=True)
    stamp = FileStamp(str(source), 1, 2, 3, 4)
    doc = {"version": 1, "file": dataclasses.asdict(stamp), "rows": 1}
    (entry / "source.json").write_text(json.dumps(doc), encoding="utf-8")
    return entry


def test_prune_removes_entries_of_vanished_files_and_stale_temporaries(tmp_path: Path) -> None:
    logs, cache = tmp_path / "logs", tmp_path / "cache"
    logs.mkdir()
    (logs / "kept.log").write_bytes(b"{}\n")
    kept = _entry(cache, "a" * 32, logs / "kept.log")
    gone = _entry(cache, "b" * 32, logs / "gone.log")
    unreadable = cache / ("c" * 32)
    unreadable.mkdir()
    fresh_tmp = cache / ".tmp-x-1"
    old_tmp = cache / ".old-y-2"
    fresh_tmp.mkdir()
    old_tmp.mkdir()
    now = old_tmp.stat().st_mtime + STALE_TEMP_S / 2
    os.utime(old_tmp, (now - STALE_TEMP_S - 1, now - STALE_TEMP_S - 1))
    assert prune(cache, now=now) == 2
    assert sorted(p.name for p in cache.iterdir()) == sorted([kept.name, unreadable.name, fresh_tmp.name])
    assert not gone.exists()
    assert not old_tmp.exists()
    assert prune(cache, now=now) == 0, "nothing more to remove"


def test_cached_runs_write_the_same_tables_and_reuse_unchanged_files(
    spark: Any, batch_run: Any, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = run_batch(
        spark, str(batch_run.logs), str(tmp_path / "first"), top_clients=5, cache_dir=str(cache)
    )
    second = run_batch(
        spark, str(batch_run.logs), str(tmp_path / "second"), top_clients=5, cache_dir=str(cache)
    )
    files = len(list_input_files(str(batch_run.logs)))
    rows = batch_run.summary.input_rows
    assert first.input_cache == {"reused": 0, "staged": files, "rows_staged": rows, "pruned": 0}
    assert second.input_cache == {"reused": files, "staged": 0, "rows_staged": 0, "pruned": 0}
    for summary in (first, second):
        assert summary.input_rows == batch_run.summary.input_rows
        assert summary.malformed_by_reason == batch_run.summary.malformed_by_reason
        assert summary.table_rows == batch_run.summary.table_rows
    for name in TABLES:
        expected = _rows(spark, batch_run.output, name)
        assert _rows(spark, tmp_path / "first", name) == expected, name
        assert _rows(spark, tmp_path / "second", name) == expected, name
    assert _quarantine(spark, tmp_path / "second") == _quarantine(spark, batch_run.output)


def test_a_grown_or_rewritten_file_is_staged_again(spark: Any, batch_run: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(batch_run.logs, logs)
    cache = str(tmp_path / "cache")
    files = len(list_input_files(str(logs)))
    base = run_batch(spark, str(logs), str(tmp_path / "t0"), cache_dir=cache)

    extra = list(synthetic.iter_events(30, synthetic.CorpusOptions(seed=11)))
    with (logs / "proxy-1.log").open("ab") as out:  # grows: picked up, the others reused
        out.writelines(synthetic.encode(e) for e in extra)
    grown = run_batch(spark, str(logs), str(tmp_path / "t1"), cache_dir=cache)
    assert grown.input_cache is not None
    assert (grown.input_cache["reused"], grown.input_cache["staged"]) == (files - 1, 1)
    assert grown.input_rows == base.input_rows + len(extra)
    uncached = run_batch(spark, str(logs), str(tmp_path / "u1"))
    assert grown.table_rows == uncached.table_rows
    assert _rows(spark, tmp_path / "t1", "requests") == _rows(spark, tmp_path / "u1", "requests")

    # Rewritten in place to the same size, the modification time put back: still told apart.
    target = logs / "older" / "proxy-2.log"
    stat = target.stat()
    data = target.read_bytes()
    replacement = data.replace(b'"level":"info"', b'"level":"warn"', 1)
    assert len(replacement) == len(data)
    assert replacement != data
    target.write_bytes(replacement)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (logs / "other.log").write_bytes(synthetic.encode(extra[0]))  # a new file: picked up
    rewritten = run_batch(spark, str(logs), str(tmp_path / "t2"), cache_dir=cache)
    assert rewritten.input_cache is not None
    assert (rewritten.input_cache["reused"], rewritten.input_cache["staged"]) == (files - 1, 2)
    uncached = run_batch(spark, str(logs), str(tmp_path / "u2"))
    assert rewritten.input_rows == uncached.input_rows
    assert rewritten.table_rows == uncached.table_rows
    assert _rows(spark, tmp_path / "t2", "connections") == _rows(spark, tmp_path / "u2", "connections")

    (logs / "other.log").unlink()  # a file gone from the input is no longer read
    shrunk = run_batch(spark, str(logs), str(tmp_path / "t3"), cache_dir=cache)
    assert shrunk.input_cache is not None
    assert (shrunk.input_cache["reused"], shrunk.input_cache["staged"]) == (files, 0)
    assert shrunk.input_cache["pruned"] == 1, "the gone file's entry is removed"
    assert shrunk.input_rows == uncached.input_rows - 1
