"""SparkSession factory with quiet logs, no UI, small shuffles and uncompressed cached tables.

For ``local`` masters the driver is pinned to loopback (``SPARK_LOCAL_IP=127.0.0.1`` and
``spark.driver.host/bindAddress``) so nothing listens on a routable address. For any other master
URL (``spark://``, ``yarn``, ``k8s://``) those two settings are left to the cluster's defaults,
because remote executors must be able to reach the driver.

``fast_jvm=True`` adds ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``: it roughly halves JVM start-up
CPU, which suits tests and short jobs, not long production runs; otherwise the driver runs the
parallel (throughput) collector, ``BATCH_JVM_FLAGS``. When ``fast_jvm`` is None the
``MQPROXY_ETL_FAST_JVM`` environment variable (``1``) decides, so a notebook run by a test can opt in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

__all__ = [
    "BATCH_JVM_FLAGS",
    "CODEGEN_CACHE_ENTRIES",
    "DEFAULT_MASTER",
    "FAST_JVM_FLAGS",
    "build_session",
    "log4j_config_path",
]

DEFAULT_MASTER: Final = "local[*]"
FAST_JVM_FLAGS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Otherwise the throughput collector: a batch allocates fast and keeps its cache for the whole run;
#: G1's concurrent threads and barriers cost 2-4 CPU-s more per million events (docs/performance.md).
BATCH_JVM_FLAGS: Final = "-XX:+UseParallelGC"
CODEGEN_CACHE_ENTRIES: Final = 2000
"""``spark.sql.codegen.cache.maxEntries``: generated classes kept for reuse across a session's runs."""


def log4j_config_path() -> Path:
    """Filesystem path of the ``log4j2.properties`` shipped in this package."""
    path = Path(str(resources.files("mqproxy.spark_etl") / "log4j2.properties"))
    if not path.is_file():
        raise FileNotFoundError(f"log4j2.properties is not installed next to mqproxy.spark_etl: {path}")
    return path


def _local_parallelism(master: str) -> int | None:
    """Core count of a ``local[N]`` master; ``os.cpu_count()`` for ``local[*]``; None otherwise."""
    if master == "local":
        return 1
    if master.startswith("local[") and master.endswith("]"):
        inner = master[len("local[") : -1].split(",")[0]
        return os.cpu_count() or 1 if inner == "*" else max(1, int(inner))
    return None


def build_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "mqproxy-etl",
    fast_jvm: bool | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str = "1g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return a configured SparkSession (``getOrCreate``: an existing session is reused as is).

    ``shuffle_partitions`` defaults to the local core count (at least 2) for ``local`` masters and
    to Spark's default elsewhere. ``conf`` entries are applied last and win.
    """
    if fast_jvm is None:
        fast_jvm = os.environ.get("MQPROXY_ETL_FAST_JVM") == "1"
    java_opts = [f"-Dlog4j.configurationFile=file:{log4j_config_path()}"]
    java_opts.append(FAST_JVM_FLAGS if fast_jvm else BATCH_JVM_FLAGS)

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", " ".join(java_opts))
        .config("spark.log.level", "WARN")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.sql.debug.maxToStringFields", "200")
        # The batch job's cache is built once and scanned by every table: compressing its columns
        # costs CPU for little (1M events: 317 instead of 237 MB; docs/performance.md, round 4).
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # One batch run generates well over Spark's default 100 classes; evicted ones are generated
        # and JIT-compiled again on every run (docs/performance.md, round 5). Static: session start only.
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
    )
    cores = _local_parallelism(master)
    partitions: int | None = shuffle_partitions
    if cores is not None:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
        partitions = shuffle_partitions or max(2, cores)
        builder = builder.config("spark.default.parallelism", str(partitions))
    if partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
