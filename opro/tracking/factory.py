"""The one place that chooses where a command records: :func:`command_recorders` for every command's
record (evaluate, compare, judge calibrate, probe, export), :func:`search_recorders` for the trackers
of a search (optimize). Commands and the composition root ask here and never name a tracker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opro.search.records import Recorder
from opro.tracking.commands import MlflowCommandRecorder
from opro.tracking.mlflow import MlflowTracker
from opro.tracking.recorder import MlflowRecorder

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.paths import RunDir
    from opro.tracking.workbench import Workbench


def search_recorders(experiment: Workbench, *, run_dir: RunDir, params: Mapping[str, Any] | None = None,
                     worker_index: int = 0, num_workers: int = 1) -> list[Recorder]:
    """The trackers' recorders of worker ``worker_index`` of ``num_workers``, in the order they run
    (after the run directory's files are written: those become their artifacts).

    MLflow: one run per study, with ``params`` (worker 0's) and the run directory's files, and the
    Prompt Registry version when ``[tracking].register_prompt``. Every worker of a shared study gets it:
    worker 0 records the run, another one ends it FAILED when it gives up on a worker 0 that is gone.
    Then, on worker 0 with ``[tracking].genai`` and validation questions, the validation stage's
    evaluation runs (:class:`opro.tracking.validation_traces.ValidationTraces`), linked to that run. Without a
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
        from opro.tracking.validation_traces import ValidationTraces

        recorders.append(ValidationTraces(experiment, tracking=tracking))
    return recorders


def command_recorders(config: OproConfig, *, mlflow: bool = True, tracking_uri: str | None = None,
                      evaluated: Workbench | None = None) -> list[Recorder]:
    """The recorders a command records through under ``config``, in the order they record: MLflow
    unless ``mlflow`` is off, in ``tracking_uri`` (a command's ``--tracking-uri``) or else the config's
    store; then, for a command that evaluated prompts on the experiment ``evaluated`` and with
    ``[tracking].genai``, MLflow's GenAI evaluation runs
    (:class:`opro.tracking.evaluations.GenAIEvaluationRecorder`, linked to the first one's run)."""
    if not mlflow:
        return []
    recorders: list[Recorder] = [MlflowCommandRecorder(
        tracking_uri=tracking_uri or config.mlflow_uri,
        experiment_name=config.tracking.mlflow_experiment or config.experiment.name)]
    if evaluated is not None and config.tracking.genai:
        from opro.tracking.evaluations import GenAIEvaluationRecorder

        recorders.append(GenAIEvaluationRecorder(evaluated, tracking_uri=tracking_uri))
    return recorders


__all__ = ["command_recorders", "search_recorders"]
