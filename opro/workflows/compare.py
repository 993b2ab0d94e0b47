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
    from opro.heldout.compare import compare_prompts, default_compare_dir, save_comparison
    from opro.heldout.promotion import promote
    from opro.heldout.sources import resolve_prompt
    from opro.workflows.preflight import check_inputs

    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    specs = [_with_set(p, settings) for p in prompts]
    if baseline not in specs:
        specs.insert(0, baseline)
    exp = Experiment.from_file(config, progress=progress)
    decision = None
    try:
        # Every argument, input and place to write is checked before the plan is said or a call made.
        check_inputs(exp)
        _check_set(settings, exp.config)
        resolved = [resolve_prompt(s, config=exp.config, tracking_uri=tracking_uri) for s in specs]
        target = out if out is not None else default_compare_dir(exp, name)
        _check_report_folder(target, given=out is not None)
        if mlflow or promote_alias:
            from opro.tracking import check_writable

            check_writable(tracking_uri or exp.config.mlflow_uri,
                           where="--tracking-uri" if tracking_uri else "[tracking].mlflow_uri",
                           off="--no-mlflow" if not promote_alias else "--no-mlflow and without --promote")
        if split == "heldout":
            from opro.probe.plan import make_plan
            from opro.probe.store import pilot_noise

            notice("\n".join(make_plan(exp.config, pilot_noise=pilot_noise(exp),
                                        noise_digest=exp.noise_digest()).compare_lines()))
        report = compare_prompts(
            experiment=exp, prompts=resolved, baseline=specs.index(baseline), split=split,
            extra_metrics=list(metrics), tracking_uri=tracking_uri, alpha=alpha, n_resamples=resamples, seed=seed,
            margin=margin,
        )
        saved = save_comparison(report, experiment=exp, directory=target, mlflow=mlflow, tracking_uri=tracking_uri)
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


def _check_report_folder(target: Path, *, given: bool) -> None:
    """Refuse a report folder that cannot be written (:func:`opro.tracking.rundir.unwritable`), naming
    ``--out``, before any call: the comparison's answers would be paid for and then lost."""
    from opro.errors import ConfigError
    from opro.tracking.rundir import unwritable

    why = unwritable(target, folder=True)
    if why is not None:
        where = "--out" if given else "the report folder under [experiment].output_dir"
        raise ConfigError(f"{where} {target} cannot be written: {why}. Make it writable or give --out a folder this "
                          "user may write; nothing was asked or written")


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
