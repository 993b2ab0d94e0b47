"""What ``opro optimize`` returned: the search's result, and where the run was recorded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opro.search.records import Recorded
from opro.search.results import OptimizationResult
from opro.tracking.commands import mlflow_run_of


@dataclass(frozen=True)
class RunResult(OptimizationResult):
    """What ``opro optimize`` returned: the search's result, and where the run was recorded."""

    output_dir: Path | None = None
    #: Where the trackers recorded the run (beside ``output_dir``), in their order: ``where`` for a person.
    recorded: tuple[Recorded, ...] = ()
    #: The judge-noise note beside the gain (from ``opro calibrate``'s record), as the summary says it.
    judge_noise: str | None = None

    def summary(self) -> dict[str, Any]:
        # summary.json names the MLflow run as it always has (sources and export find the run by it).
        return {**super().summary(), "mlflow_run_id": mlflow_run_of(self.recorded), "judge_noise": self.judge_noise}


__all__ = ["RunResult"]
