"""Where a Spark batch run's time goes, from its event log (``spark.eventLog.enabled``).

:func:`summarize` reads one application's event log (JSON lines) and returns, per SQL execution
(one per action: a ``collect``, a ``count``, each table's write), its wall time and the summed task
run time and CPU time of its stages, plus per-stage rows (name, tasks, wall, run time, CPU, shuffle
bytes, input bytes). Executions are listed in start order, so a caller that knows the order of its
actions can label them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Execution", "Stage", "summarize"]


@dataclass
class Stage:
    """One completed stage."""

    stage_id: int
    name: str
    tasks: int
    wall_ms: int
    run_ms: int
    cpu_ms: int
    shuffle_read_mb: float
    shuffle_write_mb: float
    input_mb: float


@dataclass
class Execution:
    """One SQL execution (an action) and the stages its jobs ran."""

    execution_id: int
    description: str
    wall_ms: int
    stages: list[Stage] = field(default_factory=list)

    @property
    def run_ms(self) -> int:
        return sum(s.run_ms for s in self.stages)

    @property
    def cpu_ms(self) -> int:
        return sum(s.cpu_ms for s in self.stages)


def _accum(info: dict[str, Any], name: str) -> int:
    for acc in info.get("Accumulables", []):
        if acc.get("Name") == name:
            return int(acc.get("Value", 0))
    return 0


def summarize(log: Path, *, after_ms: float = 0.0) -> list[Execution]:
    """Executions that started at or after ``after_ms`` (epoch ms), with their stages."""
    executions: dict[int, Execution] = {}
    starts: dict[int, int] = {}
    job_execution: dict[int, int] = {}
    stage_job: dict[int, int] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        kind = event.get("Event", "")
        if kind.endswith("SparkListenerSQLExecutionStart"):
            if event["time"] >= after_ms:
                starts[event["executionId"]] = event["time"]
                executions[event["executionId"]] = Execution(event["executionId"], event["description"], 0)
        elif kind.endswith("SparkListenerSQLExecutionEnd"):
            ex = executions.get(event["executionId"])
            if ex is not None:
                ex.wall_ms = event["time"] - starts[event["executionId"]]
        elif kind == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            exec_id = props.get("spark.sql.execution.root.id") or props.get("spark.sql.execution.id")
            if exec_id is not None:
                job_execution[event["Job ID"]] = int(exec_id)
                for sid in event.get("Stage IDs", []):
                    stage_job[sid] = event["Job ID"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            job = stage_job.get(info["Stage ID"])
            ex = executions.get(job_execution.get(job, -1)) if job is not None else None
            if ex is None:
                continue
            ex.stages.append(
                Stage(
                    stage_id=info["Stage ID"],
                    name=info["Stage Name"],
                    tasks=info["Number of Tasks"],
                    wall_ms=info.get("Completion Time", 0) - info.get("Submission Time", 0),
                    run_ms=_accum(info, "internal.metrics.executorRunTime"),
                    cpu_ms=_accum(info, "internal.metrics.executorCpuTime") // 1_000_000,
                    shuffle_read_mb=_accum(info, "internal.metrics.shuffle.read.localBytesRead") / 1e6,
                    shuffle_write_mb=_accum(info, "internal.metrics.shuffle.write.bytesWritten") / 1e6,
                    input_mb=_accum(info, "internal.metrics.input.bytesRead") / 1e6,
                )
            )
    return [executions[k] for k in sorted(executions)]
