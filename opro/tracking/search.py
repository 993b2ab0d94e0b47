"""The trackers a search records through, as :func:`opro.tracking.commands.command_recorders` is for
the other commands: the composition root asks here and never names a tracker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opro.search.recorder import Recorder
from opro.tracking.mlflow import MlflowTracker
from opro.tracking.recorder import MlflowRecorder

if TYPE_CHECKING:
    from opro.rundir import RunDir
    from opro.workbench import Workbench


def search_recorders(experiment: Workbench, *, run_dir: RunDir, params: Mapping[str, Any] | None = None,
                     worker_index: int = 0, num_workers: int = 1) -> list[Recorder]:
    """The trackers' recorders of worker ``worker_index`` of ``num_workers``, in the order they run
    (after the run directory's files are written: those become their artifacts).

    MLflow: one run per study, with ``params`` (worker 0's) and the run directory's files, and the
    Prompt Registry version when ``[tracking].register_prompt``. Every worker of a shared study gets it:
    worker 0 records the run, another one ends it FAILED when it gives up on a worker 0 that is gone.
    Then, on worker 0 with ``[tracking].genai`` and validation questions, the validation stage's
    evaluation runs (:class:`opro.tracking.genai.ValidationTraces`), linked to that run. Without a
    validation stage there is nothing to trace, and their fixed costs (seconds of MLflow imports)
    would only compete with the search.
    """
    cfg = experiment.config
    if worker_index != 0 and num_workers <= 1:
        return []
    tracking = MlflowRecorder(
        MlflowTracker(tracking_uri=cfg.mlflow_uri, experiment_name=cfg.tracking.mlflow_experiment or cfg.experiment.name),
        params=params if worker_index == 0 else None,
        run_dir=run_dir,
        register_prompt=(cfg.prompt_name, cfg.tracking.prompt_alias) if cfg.tracking.register_prompt else None,
        sidecar=cfg.tracking.sidecar,
    )
    recorders: list[Recorder] = [tracking]
    if worker_index == 0 and cfg.tracking.genai and experiment.dataset.examples_in("validation"):
        from opro.tracking.genai import ValidationTraces

        recorders.append(ValidationTraces(experiment, tracking=tracking))
    return recorders


__all__ = ["search_recorders"]
