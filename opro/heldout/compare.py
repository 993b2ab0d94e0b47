"""Compare prompts on the held-out split: same answer model, retrieval and judge; paired statistics.

Every prompt answers the same questions with the experiment's RAG program and is scored by the
same judge, so scores pair up by question. Each prompt's mean gets a Student t interval (clipped to
what the judge's scale allows), and against the baseline the report gives win / tie / loss, the mean
difference with the betting confidence sequence's interval and its two-sided test (valid whatever the
differences' shape on the judge's scale: :mod:`opro.stats.betting`), the Wilcoxon signed-rank p-value
beside it, and says in words whether the difference is significant.

A comparison on ``heldout`` refuses to run when a held-out question (normalized) also appears in
the exemplar or optimization split, of this experiment or of any run whose prompt is compared
(:mod:`opro.heldout.guard`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.calibration.calibrate import judge_noise_note
from opro.errors import ConfigError, DataError
from opro.export.sources import ResolvedPrompt, resolve_prompt
from opro.heldout.guard import check_heldout, check_prompt_source
from opro.heldout.report import (
    RESOLUTION,
    SCALE,
    SPLITS,
    ComparisonReport,
    PromptScores,
    VersusBaseline,
    plot_survival,
)
from opro.judges.factory import build_paired_judge, make_extra_metrics
from opro.judges.sidebyside import SideBySideJudge
from opro.paths import RunDir
from opro.program.configurations import Configuration, Settings
from opro.program.cost import CostModel, paired_difference
from opro.program.dimensions import DIMENSIONS, Value, model_of
from opro.search.records import CommandRecord, EvaluatedPrompt, Recorded, Recorder, record_all
from opro.stats.clusters import keys_of
from opro.stats.noninferiority import check_margin, holm_noninferiority, noninferiority
from opro.stats.paired import compare_paired, holm_family, t_mean_ci

if TYPE_CHECKING:

    from opro.data.dataset import Example
    from opro.evaluation.batch import EvaluationReport
    from opro.tracking.workbench import Workbench

logger = logging.getLogger(__name__)

# -- the comparison ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComparisonSettings:
    """What a comparison is asked (``opro compare``'s options, one value): the prompts and the settings
    they are answered with, what it measures and tests, where it is written and recorded, and the
    promotion's rule. The CLI builds it once (``--set`` read into :attr:`settings` there) and it goes
    down whole: :func:`opro.workflows.compare.compare_and_save`, then :func:`run_comparison`."""

    #: The compared prompts' specs (:mod:`opro.export.sources`) or configurations.
    prompts: tuple[str | Configuration, ...] = ("best",)
    #: Settings every prompt in :attr:`prompts` is answered with (``--set``; a value a prompt gives too: this one).
    settings: Mapping[str, Value] = field(default_factory=Settings)
    #: The prompt the others are tested against (added first when not among them).
    baseline: str = "initial"
    split: str = "heldout"
    #: Extra metrics: names of :data:`~opro.judges.EXTRA_METRICS` or metric objects.
    metrics: tuple[str | Any, ...] = ()
    level: float = 0.95
    alpha: float = 0.05
    #: Random sign flips of the permutation test.
    resamples: int = 10_000
    seed: int = 0
    #: A non-inferiority margin in judge points (None: no non-inferiority test).
    margin: float | None = None
    #: The MLflow store (None: the config's).
    tracking_uri: str | None = None
    #: The report folder (None: ``<output_dir>/compare/<name>``) and the comparison's name (None: a timestamp).
    out: Path | None = None
    name: str | None = None
    mlflow: bool = True
    #: The registry alias to move to the best prompt on held-out evidence (None: no promotion).
    promote_alias: str | None = None
    min_coverage: float = 0.9

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompts", tuple(self.prompts))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        object.__setattr__(self, "settings", Settings(self.settings))

    def configured(self) -> list[str | Configuration]:
        """Each prompt as it is compared: with :attr:`settings` added, as a configuration (read once,
        never written back to text); the spec itself when there are none."""
        if not self.settings:
            return list(self.prompts)
        return [(p if isinstance(p, Configuration) else Configuration.parse(p.strip(), where=f"prompt {p!r}"))
                .with_settings(self.settings) for p in self.prompts]


def compare_prompts(
    *,
    experiment: Workbench,
    prompts: Sequence[str | ResolvedPrompt],
    baseline: int | str = 0,
    split: str = "heldout",
    extra_metrics: Sequence[str | Any] = (),
    tracking_uri: str | None = None,
    level: float = 0.95,
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: int = 0,
    progress: bool | None = None,
    margin: float | None = None,
) -> ComparisonReport:
    """Evaluate each prompt on ``split`` of the experiment's dataset and compare it with ``baseline``.

    ``prompts`` are specs (see :mod:`opro.export.sources`) or resolved prompts; ``baseline`` is an index
    into them or one of their specs. ``extra_metrics`` are names from :data:`~opro.judges.EXTRA_METRICS` or metric
    objects accepted by :func:`opro.evaluation.batch.evaluate_examples`. With ``margin`` (judge points)
    each prompt also gets a non-inferiority test against the baseline (Holm over the prompts)."""
    return run_comparison(experiment=experiment, prompts=prompts, baseline=baseline, progress=progress,
                          settings=ComparisonSettings(split=split, metrics=tuple(extra_metrics), tracking_uri=tracking_uri,
                                                      level=level, alpha=alpha, resamples=n_resamples, seed=seed,
                                                      margin=margin))


def run_comparison(*, experiment: Workbench, prompts: Sequence[str | Configuration | ResolvedPrompt],
                   baseline: int | str = 0, settings: ComparisonSettings, progress: bool | None = None
                   ) -> ComparisonReport:
    """:func:`compare_prompts` under ``settings`` (its split, metrics, level, alpha, resamples, seed, margin
    and store; its prompts and baseline are the workflow's, given here resolved or as specs)."""
    from opro.evaluation.batch import evaluate_templates

    started = time.perf_counter()
    split, level, alpha, n_resamples, seed = settings.split, settings.level, settings.alpha, settings.resamples, settings.seed
    margin = None if settings.margin is None else check_margin(settings.margin)
    extra_metrics, tracking_uri = settings.metrics, settings.tracking_uri
    if split not in SPLITS:
        raise ConfigError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    cfg = experiment.config
    resolved, base = _resolved(prompts, baseline=baseline, experiment=experiment, tracking_uri=tracking_uri)

    dataset = experiment.dataset
    leakage_checked = split == "heldout"
    leakage_basis, leakage_by_prompt = _guard(experiment, resolved) if leakage_checked else ("", {})
    examples: tuple[Example, ...] = dataset.examples_in(split)  # type: ignore[arg-type]
    if not examples:
        raise DataError(f"the {split} split of {experiment.dataset_dir} is empty; raise [data.split].{split}")

    metrics = [m for m in extra_metrics if not isinstance(m, str)]
    metrics += make_extra_metrics([m for m in extra_metrics if isinstance(m, str)],
                                  judge_client=lambda: experiment.client("judge"))
    cost_model = experiment.cost_model([m for p in resolved if (m := model_of(p.template.setting))])
    logger.info("evaluating %d prompts on %d %s questions", len(resolved), len(examples), split)
    # All prompts in one stream: the endpoints stay busy instead of draining between prompts. No answer
    # is decoded in a batch with another prompt's: a prompt's score must not depend on what it is
    # compared with (an embedded model's batched answers can part from lone ones on long answers).
    reports = evaluate_templates(program=experiment.program, templates=[p.template for p in resolved], examples=examples,
                                 judge=experiment.judge, extra_metrics=metrics, batch=False,
                                 progress=experiment.progress if progress is None else progress)
    results = [_prompt_scores(p, report, level=level, cost_model=cost_model)
               for p, report in zip(resolved, reports, strict=True)]
    paired = build_paired_judge(section=cfg.judge, client=experiment.client("judge"), seed=cfg.experiment.seed)
    versus = _versus_baseline(results, base, n_questions=len(examples), level=level, alpha=alpha, keys=keys_of(examples),
                              n_resamples=n_resamples, seed=seed, margin=margin, cost_model=cost_model, paired=paired)
    same = _same_configuration(resolved, base, defaults={d.name: d.initial(cfg) for d in DIMENSIONS if d.is_setting})
    versus = [None if v is None else replace(v, identical=same[i]) for i, v in enumerate(versus)]
    return ComparisonReport(
        split=split,
        questions=tuple(e.query for e in examples),
        prompts=tuple(results),
        baseline=base,
        versus=tuple(versus),
        judge=f"{experiment.judge.name} ({cfg.judge.template})" + ("; pairs judged side by side" if cfg.judge.paired == "side_by_side" else ""),
        judge_threshold=cfg.judge.threshold,
        level=level,
        alpha=alpha,
        n_resamples=n_resamples,
        seed=seed,
        dataset_hash=dataset.content_hash,
        leakage_checked=leakage_checked,
        leakage_basis=leakage_basis,
        leakage_by_prompt=leakage_by_prompt,
        models={role: experiment.spec(role).model for role in ("task", "judge")},
        config=cfg.source,
        usage=experiment.usage.as_dict(),
        wall_s=time.perf_counter() - started,
        judge_noise=judge_noise_note(cfg),
        margin=margin,
        cost_measure=cost_model.measure,
    )


def _resolved(prompts: Sequence[str | Configuration | ResolvedPrompt], *, baseline: int | str, experiment: Workbench,
              tracking_uri: str | None) -> tuple[list[ResolvedPrompt], int]:
    """The compared prompts resolved (labels made unique) and the baseline's index among them."""
    resolved = [p if isinstance(p, ResolvedPrompt) else
                resolve_prompt(p, config=experiment.config, tracking_uri=tracking_uri) for p in prompts]
    if len(resolved) < 2:
        raise ConfigError("compare needs at least two prompts (a baseline and one more)")
    base = _baseline_index(baseline, resolved)
    _dedupe_labels(resolved)
    return resolved, base


def _same_configuration(prompts: Sequence[ResolvedPrompt], base: int, *, defaults: Mapping[str, Any]) -> list[bool]:
    """Per prompt, whether it is the baseline's configuration: the same template (wording, frame,
    demonstrations) answered with the same settings (a setting a prompt leaves unset is the config's)."""
    def configuration(p: ResolvedPrompt) -> tuple[str, dict[str, Any]]:
        return p.template_text, {**defaults, **p.template.settings}

    baseline = configuration(prompts[base])
    return [i != base and configuration(p) == baseline for i, p in enumerate(prompts)]


def _guard(experiment: Workbench, prompts: Sequence[ResolvedPrompt]) -> tuple[str, dict[str, str]]:
    """The held-out guard (:mod:`opro.heldout.guard`): what the split check was made against, and per prompt
    what its provenance let it check. Raises :class:`~opro.errors.LeakageError` on an overlap."""
    dataset, output_dir = experiment.dataset, experiment.config.output_dir
    embed = experiment.paraphrase_embed()
    basis = check_heldout(dataset, output_dir=output_dir, embed=embed)
    return basis, {p.label: check_prompt_source(p, dataset=dataset, own_dir=Path(output_dir), embed=embed)
                   for p in prompts}


def _prompt_scores(p: ResolvedPrompt, report: EvaluationReport, *, level: float, cost_model: CostModel) -> PromptScores:
    """One prompt's evaluation as the comparison reads it: its scores, mean interval and cost."""
    scores = tuple(r.score if r.scored else None for r in report.rows)
    valid = [s for s in scores if s is not None]
    return PromptScores(
        label=p.label,
        spec=p.spec,
        kind=p.kind,
        instruction=p.instruction,
        template_text=p.template_text,
        settings=p.template.settings,
        provenance=dict(p.provenance),
        scores=scores,
        mean=t_mean_ci(valid, level=level, bounds=SCALE, resolution=RESOLUTION) if valid else None,
        pass_rate=report.pass_rate,
        n_invalid=report.n_invalid,
        n_errors=report.n_errors,
        metric_means=report.metric_means(),
        metric_invalid=report.metric_invalid(),
        evaluation=report,
        cost=cost_model.summarize(report.rows),
    )


def _versus_baseline(
    results: Sequence[PromptScores], base: int, *, n_questions: int, level: float, alpha: float, n_resamples: int,
    seed: int, margin: float | None, cost_model: CostModel, keys: Sequence[str] | None = None,
    paired: SideBySideJudge | None = None,
) -> list[VersusBaseline | None]:
    """Each prompt against the baseline (``None`` for the baseline itself) on the questions both got a
    valid score for: paired tests, cost difference, non-inferiority under a margin, Holm over the family.
    ``keys``: each question's cluster (:mod:`opro.stats.clusters`): the tests count source passages. With
    ``paired`` (``[judge].paired = "side_by_side"``) the tests read its scores of each question's two answers."""
    versus: list[VersusBaseline | None] = []
    b = results[base]
    for i, r in enumerate(results):
        if i == base:
            versus.append(None)
            continue
        keyed = keys if keys is not None else [f"#{k}" for k in range(len(b.scores))]
        mine, theirs = (r.scores, b.scores) if paired is None else _side_by_side(paired, r, b)
        kept = [(x, y, k) for x, y, k in zip(mine, theirs, keyed, strict=True) if x is not None and y is not None]
        pairs, on = [(x, y) for x, y, _ in kept], [k for _, _, k in kept]
        stats = compare_paired(
            [x for x, _ in pairs], [y for _, y in pairs], level=level, alpha=alpha, scale=SCALE, clusters=on,
        )
        ni = None if margin is None else noninferiority([x for x, _ in pairs], [y for _, y in pairs], margin=margin,
                                                         alpha=alpha, scale=SCALE, clusters=on)
        versus.append(VersusBaseline(label=r.label, baseline=b.label, n_dropped=n_questions - len(pairs), stats=stats,
                                     cost=paired_difference(r.evaluation.rows, b.evaluation.rows, model=cost_model,
                                                            level=level), noninferiority=ni))
    # Several prompts against one baseline: a family of tests, so Holm-adjust the p-values.
    family = [v for v in versus if v is not None]
    if len(family) > 1:
        adjusted = iter(holm_family([v.stats for v in family]))
        versus = [None if v is None else replace(v, stats=next(adjusted)) for v in versus]
        if margin is not None:
            ni_adjusted = iter(holm_noninferiority([v.noninferiority for v in family if v.noninferiority is not None]))
            versus = [None if v is None else replace(v, noninferiority=next(ni_adjusted)) for v in versus]
    return versus


def _side_by_side(judge: SideBySideJudge, r: PromptScores, b: PromptScores) -> tuple[list[float | None], list[float | None]]:
    """``r``'s and the baseline's scores from one side-by-side call per question (None for both where
    either pointwise score is missing or the reply is unreadable; identical answers: their pointwise mean)."""
    asked = [i for i, (x, y) in enumerate(zip(r.scores, b.scores, strict=True)) if x is not None and y is not None]
    one, two = r.evaluation.rows, b.evaluation.rows
    verdicts = judge.judge_many([{"query": one[i].query, "reference": one[i].reference, "first": one[i].answer,
                                  "second": two[i].answer, "tie": (r.scores[i] + b.scores[i]) / 2}  # type: ignore[operator]
                                 for i in asked])
    got = {i: v.scores for i, v in zip(asked, verdicts, strict=True) if v.scores is not None}
    mine = [got[i][0] if i in got else None for i in range(len(r.scores))]
    theirs = [got[i][1] if i in got else None for i in range(len(r.scores))]
    return mine, theirs


def _baseline_index(baseline: int | str, prompts: Sequence[ResolvedPrompt]) -> int:
    if isinstance(baseline, int):
        if not 0 <= baseline < len(prompts):
            raise ConfigError(f"baseline index {baseline} is out of range for {len(prompts)} prompts")
        return baseline
    for i, p in enumerate(prompts):
        if baseline in (p.spec, p.label):
            return i
    raise ConfigError(f"baseline {baseline!r} is not one of the compared prompts: {', '.join(p.spec for p in prompts)}")


def _dedupe_labels(prompts: list[ResolvedPrompt]) -> None:
    from dataclasses import replace

    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        n = seen.get(p.label, 0)
        seen[p.label] = n + 1
        if n:
            prompts[i] = replace(p, label=f"{p.label} #{n + 1}")


# -- plot, files, MLflow --------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedComparison:
    directory: Path
    #: Where the comparison was recorded (one entry per recorder: MLflow unless ``mlflow=False``).
    recorded: tuple[Recorded, ...] = ()
    #: One MLflow GenAI evaluation run per compared prompt (``[tracking].genai``), in prompt order.
    evaluation_run_ids: tuple[str, ...] = ()


def default_compare_dir(experiment: Workbench, name: str | None = None) -> Path:
    stamp = name or datetime.now().strftime("%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[\w.\-]+", stamp):
        raise ConfigError(f"comparison name {stamp!r}: use letters, digits, '_', '-' and '.' only")
    return RunDir(experiment.config.output_dir).compare / stamp


def save_comparison(
    report: ComparisonReport,
    *,
    experiment: Workbench,
    directory: str | Path | None = None,
    name: str | None = None,
    mlflow: bool = True,
    tracking_uri: str | None = None,
    recorders: Sequence[Recorder] | None = None,
) -> SavedComparison:
    """Write the report files and record them (:func:`comparison_record`) through ``recorders``, by
    default the config's (:func:`opro.tracking.factory.command_recorders`: an MLflow run tagged
    ``opro.kind=comparison`` in ``tracking_uri`` or the config's store, unless ``mlflow`` is off).

    With ``[tracking].genai`` each prompt's evaluation also becomes an MLflow evaluation run
    (per-question traces with the judge's verdict): the config's recorders include MLflow's GenAI
    evaluations (:class:`opro.tracking.evaluations.GenAIEvaluationRecorder`).
    """
    out = Path(directory) if directory is not None else default_compare_dir(experiment, name)
    report.write(out)
    plot_survival(report, summary_path=RunDir(experiment.config.output_dir).summary, path=out / "optimism.png")
    if recorders is None:
        from opro.tracking.factory import command_recorders

        recorders = command_recorders(experiment.config, mlflow=mlflow, tracking_uri=tracking_uri, evaluated=experiment)
    from opro.tracking.evaluations import GenAIEvaluationRecorder, evaluation_runs_of

    params = {k: v for k, v in experiment.run_params().items() if not k.startswith("optimizer.")}
    recorded = record_all(recorders, comparison_record(report, out, params=params))
    return SavedComparison(directory=out, recorded=tuple(r for r in recorded if r.recorder != GenAIEvaluationRecorder.name),
                           evaluation_run_ids=evaluation_runs_of(recorded))


def comparison_record(report: ComparisonReport, directory: Path, *, params: Mapping[str, Any] | None = None
                      ) -> CommandRecord:
    """The comparison as one command record (``opro.kind = comparison``, named ``compare <folder>``):
    ``params`` and the comparison's design, each prompt's figures as metrics, and ``directory`` (the
    report files) as the record's files."""
    all_params: dict[str, Any] = dict(params or {})
    all_params.update(
        {
            "compare.split": report.split,
            "compare.n_questions": len(report.questions),
            "compare.baseline": report.baseline_prompt.spec,
            "compare.level": report.level,
            "compare.alpha": report.alpha,
            "compare.n_resamples": report.n_resamples,
            "compare.seed": report.seed,
            "compare.dataset_hash": report.dataset_hash,
            **({} if report.margin is None else {"compare.margin": report.margin}),
        }
    )
    for i, p in enumerate(report.prompts):
        all_params[f"prompt_{i}.spec"] = p.spec
        all_params[f"prompt_{i}.instruction"] = p.instruction[:500]
    metrics: dict[str, float] = {}
    for i, (p, v) in enumerate(zip(report.prompts, report.versus, strict=True)):
        if p.mean is not None:
            metrics.update({f"prompt_{i}.mean": p.mean.estimate, f"prompt_{i}.ci_low": p.mean.low,
                            f"prompt_{i}.ci_high": p.mean.high})
        if p.pass_rate is not None:
            metrics[f"prompt_{i}.pass_rate"] = p.pass_rate
        metrics[f"prompt_{i}.n_invalid"] = p.n_invalid + p.n_errors
        for name, value in p.metric_means.items():
            if value is not None:
                metrics[f"prompt_{i}.{name}"] = value
        if v is not None and v.stats.n:
            s = v.stats
            metrics.update({
                f"prompt_{i}.diff_mean": s.difference.estimate,
                f"prompt_{i}.diff_ci_low": s.difference.low,
                f"prompt_{i}.diff_ci_high": s.difference.high,
                f"prompt_{i}.wins": s.win_tie_loss.wins,
                f"prompt_{i}.ties": s.win_tie_loss.ties,
                f"prompt_{i}.losses": s.win_tie_loss.losses,
                f"prompt_{i}.wilcoxon_p": s.wilcoxon.p_value,
                f"prompt_{i}.betting_p": s.test.p_value,
            })
        if v is not None and v.noninferiority is not None:
            metrics[f"prompt_{i}.noninferiority_p"] = v.noninferiority.p_value
    return CommandRecord(
        kind="comparison", name=f"compare {directory.name}", params=all_params, metrics=metrics,
        tags={"opro.split": report.split, "opro.baseline": report.baseline_prompt.label[:250]},
        files={directory: None}, evaluations=_evaluated(report), split=report.split,
    )


def _evaluated(report: ComparisonReport) -> tuple[EvaluatedPrompt, ...]:
    """Each compared prompt's evaluation, question by question, as the recorders that keep every
    question take it (the baseline's tagged ``opro.role = baseline``)."""
    from opro.program.prompts import QATemplate

    return tuple(
        EvaluatedPrompt(label=p.label, template=QATemplate.from_template_text(p.template_text), report=p.evaluation,
                        tags={"opro.spec": p.spec, "opro.role": "baseline" if i == report.baseline else "compared"})
        for i, p in enumerate(report.prompts)
    )


__all__ = ["ComparisonSettings", "SavedComparison", "compare_prompts", "comparison_record", "default_compare_dir",
           "run_comparison", "save_comparison"]
