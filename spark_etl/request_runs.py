"""Aggregated ``request.run`` events expanded back into the ``request`` events they stand for.

mqproxy logs the requests of one read that share their kind (a run of MQTT PUBLISHes or PUBACKs) as one
``request.run`` event: the shared fields (``ts``, ``conn_id``, ``protocol``, ``op``, ``code``,
``latency_ms``, ``client_id``, ...), ``count`` and ``errors``, and the per-request ``statuses``,
``outcomes`` and ``topics`` arrays in order. Request ``i`` of the run is the ``request`` event with the
shared fields and ``status = statuses[i]``, ``outcome = outcomes[i]``, ``topic = topics[i]``; a run of
one is logged as a plain ``request`` already. :func:`expand` turns every run into those rows, so the
tables built from the result are the same as from one ``request`` line per request.

Input and output are valid events (:func:`mqproxy.spark_etl.transforms.valid_events` or the batch's
staged rows), with the same columns; pure ``DataFrame -> DataFrame``, nothing is computed here.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = ["PER_REQUEST", "RUN", "expand"]

RUN: Final = "request.run"
REQUEST: Final = "request"
PER_REQUEST: Final[dict[str, str]] = {"statuses": "status", "outcomes": "outcome", "topics": "topic"}
"""A run's array columns and the ``request`` column each element becomes."""
_ITEM: Final = "_request_run_item"


def expand(events: DataFrame) -> DataFrame:
    """``events`` with each ``request.run`` row replaced by its requests (``event = "request"``; the
    run's arrays, and ``count`` and ``errors`` where ``events`` has them, set to null on them, as on a
    logged ``request``). Rows of other events are untouched. ``events`` needs the three array columns,
    which mqproxy writes with one length (``count``); were one shorter, its missing elements read as null."""
    is_run = F.col("event") == RUN
    others = events.where(~is_run | F.col("event").isNull())
    item = F.col(_ITEM)
    replaced: dict[str, Column] = {
        "event": F.lit(REQUEST),
        **{single: item[array] for array, single in PER_REQUEST.items()},
        **{
            name: F.lit(None).cast(events.schema[name].dataType)
            for name in (*PER_REQUEST, "count", "errors")
            if name in events.columns
        },
    }
    runs = (
        events.where(is_run)
        .select("*", F.explode(F.arrays_zip(*(F.col(name) for name in PER_REQUEST))).alias(_ITEM))
        .select(*(replaced.get(name, F.col(name)).alias(name) for name in events.columns))
    )
    return others.unionByName(runs)
