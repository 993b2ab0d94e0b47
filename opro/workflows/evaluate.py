"""Score one prompt on a split of an experiment's golden dataset (``opro evaluate``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.data.dataset import SPLIT_NAMES
from opro.errors import ConfigError
from opro.search.records import (
    CommandRecord,
    EvaluatedPrompt,
    Recorded,
    Recorder,
    finite_metrics,
    record_all,
)

if TYPE_CHECKING:
    from opro.evaluation.rows import EvaluationReport
    from opro.export.sources import ResolvedPrompt


@dataclass(frozen=True)
class PromptEvaluated:
    """One prompt's evaluation on a split: its report, the per-question tables written, and where it
    was recorded (``recorded``: the evaluation's record, e.g. its MLflow run, then its MLflow GenAI
    evaluation run where ``[tracking].genai`` is on)."""

    prompt: ResolvedPrompt
    split: str
    report: EvaluationReport
    written: tuple[Path, ...]
    tracking_uri: str
    recorded: tuple[Recorded, ...] = ()


def evaluate_prompt(
    config: str | Path,
    *,
    prompt: str = "initial",
    split: str = "heldout",
    metrics: Sequence[str] = (),
    out: Path | None = None,
    max_errors: int | None = None,
    progress: bool | None = None,
    mlflow: bool = True,
    recorders: Sequence[Recorder] | None = None,
    notice: Callable[[str], None] = lambda _: None,
) -> PromptEvaluated:
    """Resolve ``prompt`` (best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:...) under the
    experiment ``config``, guard the held-out split (``notice`` hears what it was checked against),
    evaluate it with the correctness judge and ``metrics``, write its per-question table (``out``, .json
    or .csv, or both under ``<output_dir>/evaluate/``) and record it (:func:`evaluation_record`) through
    ``recorders``, by default the config's (MLflow unless ``mlflow`` is off; with ``[tracking].genai``
    also a GenAI evaluation run with a trace per question)."""
    from opro.config import load_config
    from opro.evaluation.batch import evaluate_examples
    from opro.experiment import Experiment
    from opro.export.sources import resolve_prompt
    from opro.heldout.guard import check_heldout
    from opro.judges import make_extra_metrics
    from opro.tracking.factory import command_recorders
    from opro.workflows.preflight import check_inputs

    if split not in SPLIT_NAMES:
        raise ConfigError(f"--split {split!r}: use one of {', '.join(SPLIT_NAMES)}")
    cfg = load_config(config)
    if recorders is None and mlflow:  # a store that is down or read-only is said before any call or file
        from opro.tracking import check_writable

        check_writable(cfg.mlflow_uri, where="[tracking].mlflow_uri", off="--no-mlflow")
    exp = Experiment(cfg, progress=progress)
    try:
        check_inputs(exp)  # a garbled dataset is said before any call or line (exit 2)
        if recorders is None:
            recorders = command_recorders(exp.config, mlflow=mlflow, evaluated=exp)
        resolved = resolve_prompt(prompt, config=exp.config)
        if split == "heldout":
            notice(check_heldout(exp.dataset, output_dir=exp.config.output_dir, embed=exp.paraphrase_embed()))
        report = evaluate_examples(
            program=exp.program,
            template=resolved.template,
            examples=exp.dataset.examples_in(split),  # type: ignore[arg-type]
            judge=exp.judge,
            extra_metrics=make_extra_metrics(list(metrics), judge_client=lambda: exp.client("judge")),
            max_errors=max_errors,
            progress=exp.progress,
        )
        params = {k: v for k, v in exp.run_params().items() if not k.startswith("optimizer.")}
    finally:
        exp.close()
    if out is not None:
        written = [report.to_json(out) if out.suffix == ".json" else report.to_csv(out)]
    else:
        stem = exp.run_dir.evaluate / f"{split}-{resolved.kind}"
        written = [report.to_csv(stem.with_suffix(".csv")), report.to_json(stem.with_suffix(".json"))]
    record = evaluation_record(report, prompt=resolved, split=split, files=written, params=params)
    return PromptEvaluated(prompt=resolved, split=split, report=report, written=tuple(written),
                           tracking_uri=exp.config.mlflow_uri, recorded=record_all(recorders, record))


def evaluation_record(report: EvaluationReport, *, prompt: ResolvedPrompt, split: str, files: Sequence[Path],
                      params: Mapping[str, Any] | None = None, genai_runs: Sequence[str] = ()) -> CommandRecord:
    """One prompt's evaluation as one command record (``opro.kind = evaluation``, named ``evaluate
    <split>: <label>``): ``params`` and the prompt and split, the judge's figures (on that split's
    questions) and the extra metrics' means as metrics, the per-question tables as files, and the
    prompt's evaluation question by question (what MLflow's GenAI evaluation runs keep, which tag the
    record's MLflow run ``opro.genai_runs``; ``genai_runs``: runs made before it, tagged here)."""
    all_params: dict[str, Any] = dict(params or {})
    all_params.update({"evaluate.split": split, "evaluate.n_questions": report.n, "evaluate.prompt": prompt.spec,
                       "evaluate.instruction": prompt.template.instruction[:500]})
    metrics = finite_metrics({
        "mean": report.mean, "pass_rate": report.pass_rate, "n_scored": report.n_scored,
        "n_invalid": report.n_invalid, "n_errors": report.n_errors,
        **{f"{name}_mean": v for name, v in report.metric_means().items()},
    })
    tags = {"opro.spec": prompt.spec, "opro.split": split}
    if genai_runs:
        tags["opro.genai_runs"] = ",".join(genai_runs)
    evaluated = EvaluatedPrompt(label=prompt.label, template=prompt.template, report=report,
                                tags={"opro.spec": prompt.spec})
    return CommandRecord(kind="evaluation", name=f"evaluate {split}: {prompt.label}", params=all_params,
                         metrics=metrics, tags=tags, files={path: "evaluate" for path in files},
                         evaluations=(evaluated,), split=split)
