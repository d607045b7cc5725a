"""Columnar cache of the batch's staged input: each log file's JSON is parsed once, later runs reuse it.

Parsing the JSON lines is the largest single cost of a batch run (docs/performance.md, rounds 3 and 4),
and rotated log files never change once closed. With a cache directory, :func:`staged_input` stages
(:func:`mqproxy.spark_etl.batch.stage_events`) each input file into its own Parquet dataset under
``cache_dir`` and returns the union of those datasets: exactly the rows and columns the uncached
batch caches in memory, so every table is the same.

Contract:

* An entry belongs to one input file (its resolved path) and records the file's size, modification
  and status-change times (ns) and inode as seen **before** the file was read. An entry is reused
  only while all four still match (the status-change time moves on any write, even one that keeps
  the size and resets the modification time); a file that grew, was rewritten or replaced is
  staged again (and its old entry replaced). A file that grows while it is being staged records
  its earlier size, so the next run stages it again: nothing appended is ever missed.
* Files are listed as Spark lists them (directories recursively; names starting with ``.`` or ``_``
  (unless holding ``=``) and ending in ``._COPYING_`` are skipped, as Spark's file index skips them).
* Entries are written under a temporary name and renamed into place, so a crashed run leaves no
  half-written entry that a later run would trust. The key also covers :data:`CACHE_VERSION` and the
  staged schema, so a change of what is staged never reuses an older entry.
* Only local paths (plain or ``file:``) are cached. Each run removes (:func:`prune`) the entries
  whose input file no longer exists (no run can reuse them) and the temporary directories a crashed
  run left more than :data:`STALE_TEMP_S` ago; entries of files that still exist stay, even when they
  are not in this run's input, since several inputs may share one cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

__all__ = [
    "CACHE_VERSION",
    "CacheStats",
    "FileStamp",
    "cacheable",
    "list_input_files",
    "prune",
    "staged_input",
]

CACHE_VERSION: Final = 1
"""Bump when what an entry holds changes in a way the staged schema does not show."""

STALE_TEMP_S: Final = 3600.0
"""Age after which a temporary entry directory (``.tmp-*``, ``.old-*``) is a crashed run's leftover."""

_SOURCE: Final = "source.json"
_DATA: Final = "data"


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What identifies one version of an input file."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileStamp:
        st = path.stat()
        return cls(str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """How the staged input was obtained: files reused from the cache and files staged now."""

    reused: int
    staged: int
    rows_staged: int
    pruned: int = 0


def cacheable(input_path: str) -> bool:
    """Whether ``input_path`` is an existing local file or directory (plain path or ``file:`` URI),
    the only kind cached; a glob pattern or a remote URI is read by Spark as before."""
    if "://" in input_path and not input_path.startswith("file:"):
        return False
    return _local(input_path).exists()


def _local(input_path: str) -> Path:
    return Path(input_path.removeprefix("file://").removeprefix("file:")).resolve()


def list_input_files(input_path: str) -> list[Path]:
    """The files Spark reads for ``input_path`` (recursive; hidden ``.``/``_`` names skipped), sorted."""
    root = _local(input_path)
    if root.is_file():
        return [root]
    found: list[Path] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        found.extend(Path(directory, f) for f in files if not _hidden(f))
    return sorted(found)


def _hidden(name: str) -> bool:
    """Names Spark's file index skips (``InMemoryFileIndex.shouldFilterOutPathName``)."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def _entry_dir(cache_dir: Path, path: Path, schema_json: str) -> Path:
    key = hashlib.sha256(f"{CACHE_VERSION}\0{schema_json}\0{path}".encode()).hexdigest()[:32]
    return cache_dir / key


def _read_stamp(entry: Path) -> tuple[FileStamp, int] | None:
    try:
        doc = json.loads((entry / _SOURCE).read_text(encoding="utf-8"))
        return FileStamp(**doc["file"]), int(doc["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prune(cache_dir: Path, *, now: float | None = None) -> int:
    """Remove the entries of ``cache_dir`` whose input file is gone, and temporary directories older
    than :data:`STALE_TEMP_S` (by modification time); returns how many directories were removed. An
    entry without a readable stamp is left alone (it is replaced when its file is staged again)."""
    now = time.time() if now is None else now
    removed = 0
    for entry in cache_dir.iterdir():
        if not entry.is_dir():
            continue
        if entry.name.startswith((".tmp-", ".old-")):
            try:
                stale = now - entry.stat().st_mtime > STALE_TEMP_S
            except OSError:
                continue
        else:
            known = _read_stamp(entry)
            stale = known is not None and not os.path.exists(known[0].path)
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _stage_file(
    spark: SparkSession,
    stamp: FileStamp,
    entry: Path,
    stage: Callable[[SparkSession, str], DataFrame],
) -> int:
    """Stage one file into ``entry`` (atomically replacing an older one); return its row count."""
    tmp = entry.with_name(f".tmp-{entry.name}-{uuid.uuid4().hex}")
    spark.sparkContext.setJobDescription(f"mqproxy-etl batch: stage {Path(stamp.path).name}")
    observation = Observation(f"stage-{tmp.name}")
    staged = stage(spark, stamp.path).observe(observation, F.count(F.lit(1)).alias("rows"))
    staged.write.mode("overwrite").parquet(str(tmp / _DATA))
    rows = int(observation.get["rows"])
    doc = {"version": CACHE_VERSION, "file": asdict(stamp), "rows": rows}
    (tmp / _SOURCE).write_text(json.dumps(doc, sort_keys=True) + "\n", encoding="utf-8")
    old = entry.with_name(f".old-{entry.name}-{uuid.uuid4().hex}")
    if entry.exists():
        entry.rename(old)
    tmp.rename(entry)
    shutil.rmtree(old, ignore_errors=True)
    return rows


def staged_input(
    spark: SparkSession,
    input_path: str,
    cache_dir: str,
    stage: Callable[[SparkSession, str], DataFrame],
    schema_of: Callable[[SparkSession], DataFrame],
    *,
    threads: int | None = None,
) -> tuple[DataFrame, CacheStats]:
    """The staged rows of every file under ``input_path``, from ``cache_dir`` where still valid.

    ``stage(spark, path)`` builds the staged frame of one file (JSON read + staging); ``schema_of``
    an empty frame of the staged schema (used for the key and when there is no row at all). Files
    missing or changed in the cache are staged first, ``threads`` at a time (default: Spark's
    default parallelism, so single-task files keep every core busy).
    """
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    pruned = prune(cache)
    empty = schema_of(spark)
    schema_json = empty.schema.json()
    files = list_input_files(input_path)
    todo: list[tuple[FileStamp, Path]] = []
    datasets: dict[Path, int] = {}
    for path in files:
        stamp = FileStamp.of(path)
        entry = _entry_dir(cache, path, schema_json)
        known = _read_stamp(entry)
        if known is not None and known[0] == stamp:
            datasets[entry] = known[1]
        else:
            todo.append((stamp, entry))
    rows_staged = 0
    if todo:
        workers = max(1, threads or spark.sparkContext.defaultParallelism)
        with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
            counts = list(pool.map(lambda item: _stage_file(spark, item[0], item[1], stage), todo))
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
        for (_, entry), rows in zip(todo, counts, strict=True):
            datasets[entry] = rows
        rows_staged = sum(counts)
    stats = CacheStats(
        reused=len(files) - len(todo), staged=len(todo), rows_staged=rows_staged, pruned=pruned
    )
    paths: Sequence[str] = [str(entry / _DATA) for entry, rows in sorted(datasets.items()) if rows]
    if not paths:
        return empty, stats
    return spark.read.schema(empty.schema).parquet(*paths), stats
