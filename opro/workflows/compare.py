"""Compare prompts on a split, save and record the comparison, and optionally promote the best
prompt (``opro compare``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.heldout.compare import ComparisonSettings, SavedComparison
    from opro.heldout.promotion import PromotionDecision
    from opro.heldout.report import ComparisonReport
    from opro.program.dimensions import Value


@dataclass(frozen=True)
class ComparisonRun:
    """The comparison, where it was saved and recorded, and the promotion's decision (when asked)."""

    report: ComparisonReport
    saved: SavedComparison
    decision: PromotionDecision | None = None


def compare_and_save(
    config: str | Path,
    settings: ComparisonSettings,
    *,
    progress: bool | None = None,
    notice: Callable[[str], None] = lambda _: None,
) -> ComparisonRun:
    """Compare ``settings.prompts`` (and its baseline, added first when not among them) under the
    experiment ``config``, each prompt answered with ``settings.settings`` (``--set``, read once into the
    settings and checked here against the config); ``notice`` hears the plan's lines for a held-out
    comparison before it runs. The report is saved under ``settingsettings.out`` (or
    ``<output_dir>/compare/<name>``) and recorded (MLflow unless ``settingsettings.mlflow`` is off); with
    ``settings.promote_alias``, the alias moves only on held-out evidence (see
    :func:`opro.heldout.promotion.promote`)."""
    from opro.config import check_mlflow_uri
    from opro.experiment import Experiment
    from opro.export.sources import resolve_prompt
    from opro.heldout.compare import default_compare_dir, run_comparison, save_comparison
    from opro.heldout.promotion import promote
    from opro.workflows.preflight import check_inputs

    tracking_uri, promote_alias, baseline = settings.tracking_uri, settings.promote_alias, settings.baseline
    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    specs = settings.configured()
    if baseline not in specs:
        specs.insert(0, baseline)
    exp = Experiment.from_file(config, progress=progress)
    decision = None
    try:
        # Every argument, input and place to write is checked before the plan is said or a call made.
        check_inputs(exp)
        _check_set(settings.settings, exp.config)
        resolved = [resolve_prompt(s, config=exp.config, tracking_uri=tracking_uri) for s in specs]
        target = settings.out if settings.out is not None else default_compare_dir(exp, settings.name)
        _check_report_folder(target, given=settings.out is not None)
        if settings.mlflow or promote_alias:
            from opro.tracking import check_writable

            check_writable(tracking_uri or exp.config.mlflow_uri,
                           where="--tracking-uri" if tracking_uri else "[tracking].mlflow_uri",
                           off="--no-mlflow" if not promote_alias else "--no-mlflow and without --promote")
        if settings.split == "heldout":
            from opro.probe.plan import make_plan
            from opro.probe.store import pilot_noise

            notice("\n".join(make_plan(exp.config, pilot_noise=pilot_noise(exp),
                                        noise_digest=exp.noise_digest()).compare_lines()))
        report = run_comparison(experiment=exp, prompts=resolved, baseline=specs.index(baseline), settings=settings)
        saved = save_comparison(report, experiment=exp, directory=target, mlflow=settings.mlflow, tracking_uri=tracking_uri)
        if promote_alias is not None:
            decision = promote(report, experiment=exp, alias=promote_alias, tracking_uri=tracking_uri,
                               min_coverage=settings.min_coverage)
    finally:
        exp.close()
    return ComparisonRun(report=report, saved=saved, decision=decision)


def _check_set(settings: Mapping[str, Value], config: OproConfig) -> None:
    """Refuse a ``--set`` value the config cannot give (a task model it names no table for), saying it
    came from ``--set``: once merged into each prompt's settings, it reads as the prompt's own."""
    import functools

    from opro.errors import ConfigError
    from opro.program.dimensions import dimension

    for key, value in settings.items():
        error = dimension(key).check([value], config, said=functools.partial("--set {}={}".format, key))
        if error:
            raise ConfigError(error)


def _check_report_folder(target: Path, *, given: bool) -> None:
    """Refuse a report folder that cannot be written (:func:`opro.paths.unwritable`), naming
    ``--out``, before any call: the comparison's answers would be paid for and then lost."""
    from opro.errors import ConfigError
    from opro.paths import unwritable

    why = unwritable(target, folder=True)
    if why is not None:
        where = "--out" if given else "the report folder under [experiment].output_dir"
        raise ConfigError(f"{where} {target} cannot be written: {why}. Make it writable or give --out a folder this "
                          "user may write; nothing was asked or written")
