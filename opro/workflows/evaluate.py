"""Score one prompt on a split of an experiment's golden dataset (``opro evaluate``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opro.dataset import SPLIT_NAMES
from opro.errors import ConfigError

if TYPE_CHECKING:
    from opro.evaluation_types import EvaluationReport
    from opro.records import Recorded
    from opro.sources import ResolvedPrompt
    from opro.tracking.genai import GenAIRecord


@dataclass(frozen=True)
class PromptEvaluated:
    """One prompt's evaluation on a split: its report, the per-question tables written, and where it
    was recorded (``recorded``: its MLflow GenAI evaluation run where ``[tracking].genai`` is on)."""

    prompt: ResolvedPrompt
    split: str
    report: EvaluationReport
    written: tuple[Path, ...]
    genai: GenAIRecord | None
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
    notice: Callable[[str], None] = lambda _: None,
) -> PromptEvaluated:
    """Resolve ``prompt`` (best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:...) under the
    experiment ``config``, guard the held-out split (``notice`` hears what it was checked against),
    evaluate it with the correctness judge and ``metrics``, log it as a GenAI evaluation run and write
    its per-question table: ``out`` (.json or .csv), or both under ``<output_dir>/evaluate/``."""
    from opro.evaluation import evaluate_examples
    from opro.experiment import Experiment
    from opro.guard import check_heldout
    from opro.judges import make_extra_metrics
    from opro.sources import resolve_prompt

    if split not in SPLIT_NAMES:
        raise ConfigError(f"--split {split!r}: use one of {', '.join(SPLIT_NAMES)}")
    exp = Experiment.from_file(config, progress=progress)
    try:
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
        genai = None
        if exp.config.tracking.genai:
            from opro.tracking.genai import PromptEvaluation, genai_logger

            genai = genai_logger(exp).log_evaluations(
                [PromptEvaluation(label=resolved.label, template=resolved.template, report=report,
                                  tags={"opro.spec": resolved.spec})],
                dataset=exp.dataset, split=split, source="evaluate", run_name_prefix="evaluate: ",
            )
    finally:
        exp.close()
    if out is not None:
        written = [report.to_json(out) if out.suffix == ".json" else report.to_csv(out)]
    else:
        stem = exp.run_dir.evaluate / f"{split}-{resolved.kind}"
        written = [report.to_csv(stem.with_suffix(".csv")), report.to_json(stem.with_suffix(".json"))]
    return PromptEvaluated(prompt=resolved, split=split, report=report, written=tuple(written), genai=genai,
                           tracking_uri=exp.config.mlflow_uri,
                           recorded=() if genai is None else genai.recorded(exp.config.mlflow_uri))
