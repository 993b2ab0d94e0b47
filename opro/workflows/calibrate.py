"""Measure the judge of an experiment against right, wrong and near-miss answers (``opro judge calibrate``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opro.calibration.calibrate import CalibrationReport
    from opro.search.records import Recorded


@dataclass(frozen=True)
class JudgeCalibrated:
    """The calibration, the files written and where it was recorded."""

    report: CalibrationReport
    paths: Mapping[str, Path]
    recorded: tuple[Recorded, ...]


def calibrate_judge(
    config: str | Path,
    *,
    n: int = 40,
    seed: int | None = None,
    conditions: Sequence[str] = ("reference", "wrong", "task", "number", "name", "first-sentence"),
    retest: int = 5,
    judge: str | None = None,
    template: str | None = None,
    score_from: str | None = None,
    max_tokens: int | None = None,
    mlflow: bool = True,
    progress: bool = True,
) -> JudgeCalibrated:
    """Calibrate the judge of the experiment ``config`` (or ``judge``, a model spec, with ``template``,
    ``score_from`` and ``max_tokens`` instead of [judge]'s) on ``n`` sampled questions; write
    ``<output_dir>/judge_calibration.json`` and its verdicts and plot, and record it (MLflow unless
    ``mlflow`` is off)."""
    import dataclasses

    from opro.calibration.agreement import parse_model_spec
    from opro.calibration.calibrate import calibrate_experiment, calibration_record, write_calibration
    from opro.config import JudgeSection, check_score_from, load_config
    from opro.experiment import Experiment
    from opro.search.records import record_all
    from opro.tracking.factory import command_recorders

    cfg = load_config(config)
    given = {"template": template, "score_from": score_from, "max_tokens": max_tokens}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if overrides:
        if score_from is not None:
            check_score_from(score_from, where="--score-from")
        cfg = dataclasses.replace(cfg, judge=JudgeSection(**{**dataclasses.asdict(cfg.judge), **overrides}))
    if judge is not None:
        cfg = dataclasses.replace(cfg, models=dataclasses.replace(cfg.models, judge=parse_model_spec(judge)))
    exp = Experiment(cfg, progress=progress)
    try:
        report, verdicts = calibrate_experiment(exp, n=n, seed=seed, conditions=list(conditions), retest=retest,
                                                progress=progress)
    finally:
        exp.close()
    paths = write_calibration(report, verdicts, output_dir=cfg.output_dir)
    recorded = record_all(command_recorders(cfg, mlflow=mlflow), calibration_record(report, paths))
    return JudgeCalibrated(report=report, paths=paths, recorded=recorded)
