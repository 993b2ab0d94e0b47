"""A command's evaluations as MLflow GenAI evaluation runs, recorded through the one recording seam.

:class:`GenAIEvaluationRecorder` is a :class:`~opro.search.records.Recorder` of commands like MLflow's own:
:func:`opro.tracking.commands.command_recorders` adds it with ``[tracking].genai`` for the commands that
evaluate prompts (``opro evaluate``, ``opro compare``). It records the record's
:class:`~opro.search.records.EvaluatedPrompt` s, one evaluation run per prompt with a trace per
question and the judge's verdict, linked to the command's own MLflow run (recorded before it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opro.redaction import redact_url
from opro.search.records import CommandRecord, Recorded, Recorder
from opro.tracking.commands import mlflow_run_of
from opro.tracking.genai import CORRECTNESS, GenAILogger, GenAIRecord, PromptEvaluation

if TYPE_CHECKING:
    from opro.tracking.workbench import Workbench


def genai_logger(experiment: Workbench, *, tracking_uri: str | None = None) -> GenAILogger:
    """A logger on the experiment's MLflow store (or ``tracking_uri``), experiment and prompt name."""
    return GenAILogger(**_logger_settings(experiment, tracking_uri=tracking_uri))


def _logger_settings(experiment: Workbench, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """:func:`genai_logger`'s arguments: plain values, so a logger can be built in another process."""
    from opro.program.rag import CONTEXT_SEPARATOR

    cfg = experiment.config
    return dict(
        tracking_uri=tracking_uri or cfg.mlflow_uri,
        experiment_name=cfg.tracking.mlflow_experiment or cfg.experiment.name,
        dataset_prefix=cfg.experiment.name,
        prompt_name=cfg.prompt_name,
        task_model=experiment.spec("task").model,
        judge_name=f"{CORRECTNESS} ({cfg.judge.template})",
        judge_model=experiment.spec("judge").model,
        judge_threshold=cfg.judge.threshold,
        context_separator=CONTEXT_SEPARATOR,
    )


class GenAIEvaluationRecorder(Recorder):
    """One MLflow GenAI evaluation run per evaluated prompt of a command's record, over the split's
    evaluation dataset, in ``tracking_uri`` (else the config's store).

    A comparison's runs are named ``compare NAME: LABEL`` and tagged with the comparison
    (``opro.comparison``) and its MLflow run (``opro.comparison_run_id``), so MLflow's evaluation-run
    comparison pairs them by question; an evaluation's run is named ``evaluate: LABEL`` and its command's
    MLflow run is tagged with it (``opro.genai_runs``). A record without evaluations is not this
    recorder's to keep (None)."""

    name = "mlflow-genai"

    def __init__(self, experiment: Workbench, *, tracking_uri: str | None = None) -> None:
        self.experiment = experiment
        self.tracking_uri = tracking_uri

    def record(self, record: CommandRecord) -> Recorded | None:
        if not record.evaluations or record.split is None:
            return None
        log = genai_logger(self.experiment, tracking_uri=self.tracking_uri)
        evaluations = [PromptEvaluation(label=e.label, template=e.template, report=e.report, tags=dict(e.tags))
                       for e in record.evaluations]
        command_run = mlflow_run_of(record.earlier)
        if record.kind == "comparison":
            name = record.name.removeprefix("compare ")
            tags = {"opro.comparison": name, **({"opro.comparison_run_id": command_run} if command_run else {})}
            done = log.log_evaluations(evaluations, dataset=self.experiment.dataset, split=record.split,
                                       source="compare", run_name_prefix=f"compare {name}: ", tags=tags)
        else:
            done = log.log_evaluations(evaluations, dataset=self.experiment.dataset, split=record.split,
                                       source="evaluate", run_name_prefix="evaluate: ")
            if command_run:
                log.set_run_tag(command_run, "opro.genai_runs", ",".join(done.run_ids))
        return _recorded(done, self.name, log.tracking_uri)


def _recorded(done: GenAIRecord, recorder: str, tracking_uri: str) -> Recorded:
    runs = ", ".join(f"{r.run_id} ({len(r.trace_ids)} traces)" for r in done.runs)
    plural = "s" if len(done.runs) != 1 else ""
    return Recorded(recorder=recorder, ref=",".join(done.run_ids),
                    where=f"MLflow evaluation run{plural} {runs} in {redact_url(tracking_uri)}")


def evaluation_runs_of(recorded: tuple[Recorded, ...] | list[Recorded]) -> tuple[str, ...]:
    """The MLflow evaluation runs among where a command's record was recorded (none: not recorded there)."""
    return tuple(run for r in recorded if r.recorder == GenAIEvaluationRecorder.name for run in r.ref.split(",") if run)


__all__ = ["GenAIEvaluationRecorder", "evaluation_runs_of", "genai_logger"]
