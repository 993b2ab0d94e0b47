"""Compare prompts on a split, save and record the comparison, and optionally promote the best
prompt (``opro compare``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.heldout.compare import SavedComparison
    from opro.heldout.promotion import PromotionDecision
    from opro.heldout.report import ComparisonReport


@dataclass(frozen=True)
class ComparisonRun:
    """The comparison, where it was saved and recorded, and the promotion's decision (when asked)."""

    report: ComparisonReport
    saved: SavedComparison
    decision: PromotionDecision | None = None


def compare_and_save(
    config: str | Path,
    *,
    prompts: Sequence[str] = ("best",),
    settings: Sequence[str] = (),
    baseline: str = "initial",
    split: str = "heldout",
    metrics: Sequence[str] = (),
    out: Path | None = None,
    name: str | None = None,
    tracking_uri: str | None = None,
    mlflow: bool = True,
    resamples: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    margin: float | None = None,
    promote_alias: str | None = None,
    min_coverage: float = 0.9,
    progress: bool | None = None,
    notice: Callable[[str], None] = lambda _: None,
) -> ComparisonRun:
    """Compare ``prompts`` (and ``baseline``, added first when not among them) under the experiment
    ``config``, each of ``prompts`` answered with ``settings`` (``NAME=VALUE``, checked through the
    table of dimensions: ``--set``); ``notice`` hears the plan's lines for a held-out comparison before it runs. The report
    is saved under ``out`` (or ``<output_dir>/compare/<name>``) and recorded (MLflow unless ``mlflow``
    is off); with ``promote_alias``, the alias moves only on held-out evidence (see
    :func:`opro.heldout.promotion.promote`)."""
    from opro.config import check_mlflow_uri
    from opro.experiment import Experiment
    from opro.heldout.compare import compare_prompts, save_comparison
    from opro.heldout.promotion import promote

    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    specs = [_with_set(p, settings) for p in prompts]
    if baseline not in specs:
        specs.insert(0, baseline)
    exp = Experiment.from_file(config, progress=progress)
    _check_set(settings, exp.config)
    if split == "heldout":
        from opro.probe.plan import make_plan
        from opro.probe.store import pilot_noise

        notice("\n".join(make_plan(exp.config, pilot_noise=pilot_noise(exp),
                                    noise_digest=exp.noise_digest()).compare_lines()))
    if mlflow or promote_alias:
        from opro.tracking import check_server

        check_server(tracking_uri or exp.config.mlflow_uri,
                     where="--tracking-uri" if tracking_uri else "[tracking].mlflow_uri")
    decision = None
    try:
        report = compare_prompts(
            experiment=exp, prompts=specs, baseline=baseline, split=split, extra_metrics=list(metrics),
            tracking_uri=tracking_uri, alpha=alpha, n_resamples=resamples, seed=seed, margin=margin,
        )
        saved = save_comparison(report, experiment=exp, directory=out, name=name, mlflow=mlflow, tracking_uri=tracking_uri)
        if promote_alias is not None:
            decision = promote(report, experiment=exp, alias=promote_alias, tracking_uri=tracking_uri,
                               min_coverage=min_coverage)
    finally:
        exp.close()
    return ComparisonRun(report=report, saved=saved, decision=decision)


def _check_set(settings: Sequence[str], config: OproConfig) -> None:
    """Refuse a ``--set`` value the config cannot give (a task model it names no table for), saying it
    came from ``--set``: once merged into each prompt's settings, it reads as the prompt's own."""
    import functools

    from opro.errors import ConfigError
    from opro.program.configurations import parse_setting
    from opro.program.dimensions import dimension

    for text in settings:
        key, value = parse_setting(text)
        error = dimension(key).check([value], config, said=functools.partial("--set {}={}".format, key))
        if error:
            raise ConfigError(error)


def _with_set(spec: str, settings: Sequence[str]) -> str:
    """``spec`` with the ``--set`` values added to the settings it names (``initial {top_k=1}``); a
    value given both ways is the ``--set`` one."""
    from opro.program.configurations import name_of, parse_setting, split_name

    if not settings:
        return spec
    head, named = split_name(spec.strip(), where=f"prompt {spec!r}")
    for text in settings:
        key, value = parse_setting(text)
        named[key] = value
    return name_of(head.strip(), named)
