"""Compare prompts on the held-out split: same answer model, retrieval and judge; paired statistics.

Every prompt answers the same questions with the experiment's RAG program and is scored by the
same judge, so scores pair up by question. Each prompt's mean gets a Student t interval, and against
the baseline the report gives win / tie / loss, the mean difference with a paired t interval (both
clipped to what the judge's scale allows), and Wilcoxon signed-rank and sign-flip permutation
p-values, and says in words whether the difference is significant.

A comparison on ``heldout`` refuses to run when a held-out question (normalized) also appears in
the exemplar or optimization split, of this experiment or of any run whose prompt is compared
(:mod:`opro.guard`).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.calibration import judge_noise_note
from opro.cost import CostDifference, CostModel, CostSummary, paired_difference
from opro.errors import ConfigError, DataError
from opro.guard import check_heldout, check_prompt_source
from opro.judges.factory import make_extra_metrics
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.noninferiority import NonInferiority, check_margin, holm_noninferiority, noninferiority
from opro.records import CommandRecord, CommandRecorder, Recorded, record_all
from opro.rundir import RunDir
from opro.sources import ResolvedPrompt, resolve_prompt
from opro.stats import ConfidenceInterval, PairedComparison, compare_paired, holm_family, t_mean_ci

if TYPE_CHECKING:
    from rich.table import Table

    from opro.dataset import Example
    from opro.evaluation import EvaluationReport
    from opro.workbench import Workbench

logger = logging.getLogger(__name__)

SPLITS = ("heldout", "validation", "optimization", "exemplar")


@dataclass(frozen=True)
class PromptScores:
    """One prompt on the comparison questions."""

    label: str
    spec: str
    kind: str
    instruction: str
    template_text: str
    provenance: Mapping[str, Any]
    #: Judge score per question (``None``: invalid judge reply or failed call), in question order.
    scores: tuple[float | None, ...]
    mean: ConfidenceInterval | None
    pass_rate: float | None
    n_invalid: int
    n_errors: int
    metric_means: Mapping[str, float | None]
    #: Per extra metric, the questions whose verdict was unreadable (counted, never hidden in a mean).
    metric_invalid: Mapping[str, int]
    evaluation: EvaluationReport
    #: The settings the prompt was answered with beside its template (``top_k``, ``answer_max_tokens``).
    settings: Mapping[str, int] = field(default_factory=dict)
    #: Means per answered question of its task calls (:mod:`opro.cost`).
    cost: CostSummary | None = None

    @property
    def n_scored(self) -> int:
        return sum(1 for s in self.scores if s is not None)


@dataclass(frozen=True)
class VersusBaseline:
    """A prompt against the baseline on the questions both got a valid score for."""

    label: str
    baseline: str
    n_dropped: int
    stats: PairedComparison
    #: Its cost per answer minus the baseline's, paired on the questions both answered (t intervals).
    cost: CostDifference | None = None
    #: With ``--margin``: the one-sided test of not being worse than the baseline by more than it.
    noninferiority: NonInferiority | None = None

    @property
    def sentence(self) -> str:
        said = f"{self.label} vs {self.baseline}: {self.stats.verdict()}"
        if self.noninferiority is None:
            return said
        d = self.stats.difference
        quality = "quality n/a" if self.stats.n == 0 else f"quality {d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]"
        saved = "cost per answer not measured" if self.cost is None else self.cost.saving_text()
        return f"{said}. Non-inferiority: {saved}; {quality}, {self.noninferiority.text()}"


@dataclass(frozen=True)
class ComparisonReport:
    split: str
    questions: tuple[str, ...]
    prompts: tuple[PromptScores, ...]
    baseline: int
    #: One entry per prompt, ``None`` for the baseline itself.
    versus: tuple[VersusBaseline | None, ...]
    judge: str
    judge_threshold: float
    level: float
    alpha: float
    n_resamples: int
    seed: int
    dataset_hash: str
    #: The split was checked disjoint from exemplar and optimization questions.
    leakage_checked: bool
    models: Mapping[str, str] = field(default_factory=dict)
    #: What the held-out check was made against (the split `opro optimize` recorded, or only the current one).
    leakage_basis: str = ""
    #: Per prompt label: what its provenance let the guard check, or why it could not ("unchecked: ...").
    leakage_by_prompt: Mapping[str, str] = field(default_factory=dict)
    config: str = ""
    usage: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    #: The judge's measured noise (`opro judge calibrate`), or how to measure it: shown beside the gains.
    judge_noise: str = ""
    #: The non-inferiority margin in judge points (``--margin``), None without one.
    margin: float | None = None

    @property
    def baseline_prompt(self) -> PromptScores:
        return self.prompts[self.baseline]

    # -- renderings --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        def ci(c: ConfidenceInterval | None) -> dict[str, float | str | None] | None:
            return None if c is None else {"estimate": _num(c.estimate), "low": _num(c.low), "high": _num(c.high),
                                           "method": c.method, "note": c.note}

        prompts = []
        for p, v in zip(self.prompts, self.versus, strict=True):
            entry: dict[str, Any] = {
                "label": p.label,
                "spec": p.spec,
                "kind": p.kind,
                "instruction": p.instruction,
                "template": p.template_text,
                "settings": dict(p.settings),
                "provenance": dict(p.provenance),
                "mean": ci(p.mean),
                "pass_rate": p.pass_rate,
                "n_scored": p.n_scored,
                "n_invalid": p.n_invalid,
                "n_errors": p.n_errors,
                "metric_means": dict(p.metric_means),
                "metric_invalid": dict(p.metric_invalid),
                "scores": list(p.scores),
                "answers": [r.answer for r in p.evaluation.rows],
                "cost": None if p.cost is None else p.cost.as_dict(),
            }
            if v is not None:
                s = v.stats
                entry["versus_baseline"] = {
                    "n_pairs": s.n,
                    "n_dropped": v.n_dropped,
                    "wins": s.win_tie_loss.wins,
                    "ties": s.win_tie_loss.ties,
                    "losses": s.win_tie_loss.losses,
                    "mean_difference": ci(s.difference),
                    "wilcoxon_p": s.wilcoxon.p_value,
                    "wilcoxon_exact": s.wilcoxon.exact,
                    "permutation_p": s.permutation.p_value,
                    "permutation_exact": s.permutation.exact,
                    "n_comparisons": s.n_comparisons,
                    "wilcoxon_p_holm": s.p_wilcoxon,
                    "permutation_p_holm": s.p_permutation,
                    "significant": s.significant,
                    "verdict": v.sentence,
                    "cost_difference": None if v.cost is None else v.cost.as_dict(),
                    "non_inferiority": None if v.noninferiority is None else v.noninferiority.as_dict(),
                }
            prompts.append(entry)
        return {
            "format": "opro.comparison/v1",
            "split": self.split,
            "n_questions": len(self.questions),
            "questions": list(self.questions),
            "baseline": self.baseline_prompt.label,
            "judge": self.judge,
            "judge_threshold": self.judge_threshold,
            "confidence_level": self.level,
            "interval_method": INTERVALS,
            "alpha": self.alpha,
            "margin": self.margin,
            "n_comparisons": self.n_comparisons,
            "multiplicity": self.multiplicity(),
            "n_resamples": self.n_resamples,
            "seed": self.seed,
            "dataset_hash": self.dataset_hash,
            "leakage_checked": self.leakage_checked,
            "leakage_basis": self.leakage_basis,
            "leakage_by_prompt": dict(self.leakage_by_prompt),
            "models": dict(self.models),
            "config": self.config,
            "usage": dict(self.usage),
            "wall_s": round(self.wall_s, 2),
            "judge_noise": self.judge_noise,
            "prompts": prompts,
        }

    def _rows(self) -> list[list[str]]:
        """The report's table (report.md): one row per prompt, its cells in :meth:`_columns`' order."""
        return [list(cells.values()) for cells in self._cells()]

    def _cells(self) -> list[dict[str, str]]:
        """Per prompt, its cells by key (``prompt``, ``mean``, ... ``metric:NAME`` ... ``tokens``,
        ``seconds``, ``d_tokens``, ``d_seconds``, and with a margin ``noninferiority``), in the order
        of :meth:`_columns`: the one source of report.md's table and of the terminal's tables."""
        rows = []
        for p, v in zip(self.prompts, self.versus, strict=True):
            mean = "n/a" if p.mean is None else f"{p.mean.estimate:.2f} [{p.mean.low:.2f}, {p.mean.high:.2f}]" + _mark(p.mean)
            row = {
                "prompt": p.label + (" (baseline)" if v is None else ""),
                "mean": mean,
                "pass": _pct(p.pass_rate),
                "scored": f"{p.n_scored}/{len(p.scores)}",
                "invalid": str(p.n_invalid + p.n_errors),
            }
            if v is None:
                row |= {"wtl": "", "diff": "", "p_wilcoxon": "", "p_permutation": ""}
            else:
                s = v.stats
                d = s.difference
                row |= {
                    "wtl": str(s.win_tie_loss),
                    "diff": "n/a" if s.n == 0 else f"{d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]" + _mark(d),
                    "p_wilcoxon": f"{s.p_wilcoxon:.3g}",
                    "p_permutation": f"{s.p_permutation:.3g}",
                }
            row |= {f"metric:{m}": _fmt(p.metric_means.get(m)) + (f" ({k} invalid)" if (k := p.metric_invalid.get(m, 0)) else "")
                    for m in self.metric_names}
            row |= dict(zip(("tokens", "seconds", "d_tokens", "d_seconds"), _cost_cells(p, v), strict=True))
            if self.margin is not None:
                row["noninferiority"] = self._margin_cells(v)[0]
            rows.append(row)
        return rows

    @property
    def metric_names(self) -> list[str]:
        names: list[str] = []
        for p in self.prompts:
            names.extend(m for m in p.metric_means if m not in names)
        return names

    def _columns(self) -> list[str]:
        lvl = f"{self.level:.0%}"
        return [
            "prompt",
            f"mean [{lvl} CI]",
            f"pass@{self.judge_threshold:g}",
            "scored",
            "invalid",
            "W/T/L",
            f"Δ mean [{lvl} CI]",
            "Wilcoxon p" + (" (Holm)" if self.n_comparisons > 1 else ""),
            "perm. p" + (" (Holm)" if self.n_comparisons > 1 else ""),
            *self.metric_names,
            "tokens/answer", "s/answer", f"Δ tokens [{lvl} CI]", f"Δ s [{lvl} CI]",
            *([] if self.margin is None else [f"non-inferiority p (margin {self.margin:g})" + (" (Holm)" if self.n_comparisons > 1 else "")]),
        ]

    def _margin_cells(self, v: VersusBaseline | None) -> list[str]:
        if self.margin is None:
            return []
        ni = None if v is None else v.noninferiority
        return ["" if ni is None else f"{ni.p:.3g}" + (" (yes)" if ni.passed else "")]

    @property
    def n_comparisons(self) -> int:
        return sum(1 for v in self.versus if v is not None)

    def multiplicity(self) -> str:
        k = self.n_comparisons
        if k <= 1:
            return "1 comparison with the baseline: no multiplicity correction needed."
        return (f"{k} comparisons with the baseline: p-values are Holm-adjusted over the {k} "
                "(the raw values are in report.json).")

    def interval_notes(self) -> list[str]:
        """Why an interval marked ``*`` in the table is as wide as it is (too few questions, clipped)."""
        notes = [f"{p.label}'s mean: {p.mean.note}" for p in self.prompts if p.mean is not None and p.mean.note]
        notes += [f"{v.label} vs {v.baseline}: {v.stats.difference.note}" for v in self.versus
                  if v is not None and v.stats.n and v.stats.difference.note]
        return notes

    def sentences(self) -> list[str]:
        return [v.sentence for v in self.versus if v is not None]

    def rich_tables(self) -> list[Table]:
        """The terminal's tables: quality (mean, pass rate, and against the baseline W/T/L, the
        difference and its p-values), cost per answer (and with a margin the non-inferiority test),
        and with extra metrics their means. Each fits 80 columns with rows of at most 3 lines: rows are
        numbered as :meth:`numbered_prompts` lists the prompts, an interval sits under its estimate.
        The cells are report.md's (:meth:`_cells`); its ``invalid`` column is ``scored``'s complement."""
        from rich.table import Table

        lvl = f"{self.level:.0%}"
        holm = "\n(Holm)" if self.n_comparisons > 1 else ""
        where = "held-out" if self.split == "heldout" else f"{self.split} (not held-out)"

        def table(title: str, columns: list[str]) -> Table:
            t = Table(title=title)
            for i, col in enumerate(columns):
                t.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
            return t

        quality = table(f"opro compare: {len(self.questions)} {where} questions, judge {self.judge}",
                        ["#", f"mean\n[{lvl} CI]", f"pass@{self.judge_threshold:g}\n(scored)", "W/T/L",
                         f"Δ mean\n[{lvl} CI]", f"perm. p\n(Wilcoxon){holm}"])
        cost = table("cost per answer (the task call)",
                     ["#", "tokens\n(out)", "seconds", f"Δ tokens\n[{lvl} CI]", f"Δ seconds\n[{lvl} CI]",
                      *([] if self.margin is None else [f"not worse p\n(margin {self.margin:g}){holm}"])])
        metrics = table("extra metrics", ["#", *self.metric_names])
        for i, (c, v) in enumerate(zip(self._cells(), self.versus, strict=True), start=1):
            number, baseline = f"#{i}", v is None
            quality.add_row(number, _under(c["mean"]), f"{c['pass']}\n({c['scored']})", c["wtl"],
                            "baseline" if baseline else _under(c["diff"]),
                            f"{c['p_permutation']}\n({c['p_wilcoxon']})" if c["p_permutation"] else "")
            cost.add_row(number, _under(c["tokens"]), c["seconds"],
                         "baseline" if baseline else _under(c["d_tokens"]), _under(c["d_seconds"]),
                         *([] if self.margin is None else [c["noninferiority"]]))
            metrics.add_row(number, *(_under(c[f"metric:{m}"]) for m in self.metric_names))
        return [quality, cost, *([metrics] if self.metric_names else [])]

    def numbered_prompts(self) -> list[tuple[str, str]]:
        """``(#n, text)`` per prompt, numbered as the rows of :meth:`rich_tables`: its label (a
        literal's label is its own shortened text: left out), its instruction whole, and the settings
        it was answered with."""
        listed = []
        for i, (p, v) in enumerate(zip(self.prompts, self.versus, strict=True), start=1):
            name = ("" if p.kind == "literal" else p.label) + (" (baseline)" if v is None else "")
            settings = f"\n[{', '.join(f'{k} {x}' for k, x in p.settings.items())}]" if p.settings else ""
            listed.append((f"#{i}", (f"{name.strip()}: " if name else "") + p.instruction + settings))
        return listed

    def to_markdown(self) -> str:
        where = "held-out" if self.split == "heldout" else f"{self.split} (NOT held-out)"
        lines = [
            "# opro prompt comparison",
            "",
            f"{len(self.questions)} {where} questions; judge `{self.judge}` (1-5, pass at {self.judge_threshold:g}); "
            f"dataset `{self.dataset_hash[:12]}`; baseline **{self.baseline_prompt.label}**.",
            f"Intervals: {self.level:.0%} {INTERVALS}; "
            f"tests two-sided at alpha {self.alpha:g}: the paired sign-flip permutation test decides (exact up to 16 "
            f"pairs, else {self.n_resamples} random sign flips, seed {self.seed}); the Wilcoxon "
            "signed-rank p-value is shown beside it. Every answer was decoded alone (never in a batch with "
            "another prompt's), so no prompt's score depends on the prompts compared beside it.",
            self.multiplicity(),
        ]
        if self.margin is not None:
            lines.append(f"Non-inferiority margin {self.margin:g} judge points: H0 quality(prompt) - quality(baseline) "
                         f"<= -{self.margin:g}, one-sided paired sign-flip permutation test on the differences shifted "
                         f"by +{self.margin:g}, at alpha {self.alpha:g}; cost differences are paired t intervals.")
        if self.split == "heldout":
            lines.append(
                "Leakage check: "
                + ("no held-out question appears in the exemplar, optimization or validation splits"
                   + (f" ({self.leakage_basis})." if self.leakage_basis else ".") if self.leakage_checked else "not run.")
            )
            lines += [f"- {label}: {what}" for label, what in self.leakage_by_prompt.items()]
        if self.models:
            lines.append("Models: " + ", ".join(f"{k} `{v}`" for k, v in self.models.items()) + ".")
        lines += ["", "| " + " | ".join(self._columns()) + " |", "|" + "---|" * len(self._columns())]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self._rows()]
        if notes := self.interval_notes():
            lines += ["", "\\* " + "; ".join(notes) + "."]
        lines += ["", "## Verdict", ""] + [f"- {s}" for s in self.sentences()]
        if self.judge_noise:
            lines.append(f"- {self.judge_noise}")
        lines += ["", "## Prompts", ""]
        for p in self.prompts:
            with_settings = f", answered with {', '.join(f'{k} = {v}' for k, v in p.settings.items())}" if p.settings else ""
            lines += [f"**{p.label}** (`{p.spec}`{with_settings}):", "", "```text", p.template_text, "```", ""]
        lines += ["## Per question", "", "| # | question | " + " | ".join(p.label for p in self.prompts) + " |"]
        lines.append("|" + "---|" * (2 + len(self.prompts)))
        for i, q in enumerate(self.questions):
            cells = [_fmt(p.scores[i], 0) for p in self.prompts]
            lines.append(f"| {i} | {q.replace('|', '/')} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def write(self, directory: str | Path) -> Path:
        """``report.md``, ``report.json``, ``scores.csv`` and ``comparison.png`` into ``directory``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(self.to_markdown(), encoding="utf-8")
        (out / "report.json").write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
        with (out / "scores.csv").open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["question", *(p.label for p in self.prompts)])
            for i, q in enumerate(self.questions):
                writer.writerow([q, *("" if p.scores[i] is None else p.scores[i] for p in self.prompts)])
        plot_comparison(self, out / "comparison.png")
        return out


def _cost_cells(p: PromptScores, v: VersusBaseline | None) -> list[str]:
    """Tokens (prompt + completion) and seconds per answer, and the paired differences to the baseline."""
    c, d = p.cost, None if v is None else v.cost
    return [
        "n/a" if c is None else f"{c.prompt_tokens + c.completion_tokens:.0f} ({c.completion_tokens:.0f} out)",
        "n/a" if c is None else f"{c.seconds:.2f}",
        "" if v is None else "n/a" if d is None else d.tokens.text(0),
        "" if v is None else "n/a" if d is None else d.seconds.text(2),
    ]


def _under(cell: str) -> str:
    """A report cell for a narrow column: what follows its estimate (``[low, high]``, ``(n out)``) on a second line."""
    return re.sub(r" (?=[\[(])", "\n", cell, count=1)


def _num(x: float) -> float | None:
    return None if not math.isfinite(x) else x


def _mark(c: ConfidenceInterval) -> str:
    """``*`` after an interval whose width the report explains (:meth:`ComparisonReport.interval_notes`)."""
    return " *" if c.note else ""


#: The judge's score scale: a mean lies in it, a paired difference within its width either way.
SCALE = (SCORE_MIN, SCORE_MAX)
#: The judge's score step: the spread of a few scores that agree is estimated as if one more were a
#: step away (:func:`opro.stats.t_mean_ci`).
RESOLUTION = 1.0
#: How compare's intervals are made (the reports say it).
INTERVALS = ("Student t intervals of means and paired differences (spread estimated with one more score a "
             "point from the mean), clipped to the judge's 1-5 scale")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else (f"{x:.0f}" if digits == 0 else f"{x:.{digits}f}")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


# -- leakage --------------------------------------------------------------------------------------


def _first_five(items: Sequence[str]) -> str:
    """The first five items of an error listing, and how many more there are."""
    more = f" and {len(items) - 5} more" if len(items) > 5 else ""
    return "; ".join(items[:5]) + more


# -- the comparison ---------------------------------------------------------------------------------


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

    ``prompts`` are specs (see :mod:`opro.sources`) or resolved prompts; ``baseline`` is an index
    into them or one of their specs. ``extra_metrics`` are names from :data:`~opro.judges.EXTRA_METRICS` or metric
    objects accepted by :func:`opro.evaluation.evaluate_examples`. With ``margin`` (judge points)
    each prompt also gets a non-inferiority test against the baseline (Holm over the prompts).
    """
    from opro.evaluation import evaluate_templates

    started = time.perf_counter()
    if margin is not None:
        margin = check_margin(margin)
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
    cost_model: CostModel = cfg.cost_model()
    logger.info("evaluating %d prompts on %d %s questions", len(resolved), len(examples), split)
    # All prompts in one stream: the endpoints stay busy instead of draining between prompts. No answer
    # is decoded in a batch with another prompt's: a prompt's score must not depend on what it is
    # compared with (an embedded model's batched answers can part from lone ones on long answers).
    reports = evaluate_templates(program=experiment.program, templates=[p.template for p in resolved], examples=examples,
                                 judge=experiment.judge, extra_metrics=metrics, batch=False,
                                 progress=experiment.progress if progress is None else progress)
    results = [_prompt_scores(p, report, level=level, cost_model=cost_model)
               for p, report in zip(resolved, reports, strict=True)]
    versus = _versus_baseline(results, base, n_questions=len(examples), level=level, alpha=alpha,
                              n_resamples=n_resamples, seed=seed, margin=margin, cost_model=cost_model)
    return ComparisonReport(
        split=split,
        questions=tuple(e.query for e in examples),
        prompts=tuple(results),
        baseline=base,
        versus=tuple(versus),
        judge=f"{experiment.judge.name} ({cfg.judge.template})",
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
    )


def _resolved(prompts: Sequence[str | ResolvedPrompt], *, baseline: int | str, experiment: Workbench,
              tracking_uri: str | None) -> tuple[list[ResolvedPrompt], int]:
    """The compared prompts resolved (labels made unique) and the baseline's index among them."""
    resolved = [p if isinstance(p, ResolvedPrompt) else
                resolve_prompt(p, config=experiment.config, tracking_uri=tracking_uri) for p in prompts]
    if len(resolved) < 2:
        raise ConfigError("compare needs at least two prompts (a baseline and one more)")
    base = _baseline_index(baseline, resolved)
    _dedupe_labels(resolved)
    return resolved, base


def _guard(experiment: Workbench, prompts: Sequence[ResolvedPrompt]) -> tuple[str, dict[str, str]]:
    """The held-out guard (:mod:`opro.guard`): what the split check was made against, and per prompt
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
    seed: int, margin: float | None, cost_model: CostModel,
) -> list[VersusBaseline | None]:
    """Each prompt against the baseline (``None`` for the baseline itself) on the questions both got a
    valid score for: paired tests, cost difference, non-inferiority under a margin, Holm over the family."""
    versus: list[VersusBaseline | None] = []
    b = results[base]
    for i, r in enumerate(results):
        if i == base:
            versus.append(None)
            continue
        pairs = [(x, y) for x, y in zip(r.scores, b.scores, strict=True) if x is not None and y is not None]
        stats = compare_paired(
            [x for x, _ in pairs], [y for _, y in pairs], level=level, n_resamples=n_resamples, seed=seed, alpha=alpha,
            scale=SCALE, resolution=RESOLUTION,
        )
        ni = None if margin is None else noninferiority([x for x, _ in pairs], [y for _, y in pairs], margin=margin,
                                                         alpha=alpha, n_resamples=n_resamples, seed=seed)
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


def plot_comparison(report: ComparisonReport, path: Path) -> Path:
    """Left: each prompt's scores (jittered) with mean and CI. Right: paired differences vs baseline."""
    from opro.plots import plot_paired_scores

    def ci(c: ConfidenceInterval | None) -> tuple[float, float, float] | None:
        return None if c is None else (c.estimate, c.low, c.high)

    return plot_paired_scores(
        labels=[_wrap(p.label) for p in report.prompts],
        scores=[p.scores for p in report.prompts],
        means=[ci(p.mean) for p in report.prompts],
        baseline=report.prompts.index(report.baseline_prompt),
        differences=[None if v is None else ci(v.stats.difference) for v in report.versus],
        threshold=report.judge_threshold,
        title=f"scores per question ({report.split}), mean and {report.level:.0%} CI",
        baseline_label=report.baseline_prompt.label,
        path=path,
    )


def _wrap(label: str, width: int = 22) -> str:
    return "\n".join(label[i : i + width] for i in range(0, len(label), width))[:70]


def plot_survival(report: ComparisonReport, *, summary_path: Path, path: Path) -> Path | None:
    """The optimization's search and validation scores beside these held-out scores, per prompt.

    Drawn only for a held-out comparison of an optimization with a validation stage: it shows how
    much of the search gain survived on questions neither the search nor the selection saw.
    """
    if report.split != "heldout" or not summary_path.exists():
        return None
    from opro.plots import plot_optimism

    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    validation = summary.get("validation")
    if not validation:
        return None
    heldout = {p.instruction.strip(): p.mean.estimate for p in report.prompts if p.mean is not None}
    winner = validation.get("winner")
    points = [{
        "label": "initial", "search": summary.get("initial_score"), "validation": validation.get("initial_score"),
        "heldout": heldout.get(str(summary.get("initial_instruction", "")).strip()), "returned": winner is None,
    }]
    for i, f in enumerate(validation.get("finalists", []), start=1):
        points.append({
            "label": f"finalist {i}", "search": f.get("search_score"), "validation": f.get("validation_score"),
            "heldout": heldout.get(str(f.get("instruction", "")).strip()), "returned": f.get("instruction") == winner,
        })
    return plot_optimism(points, path=path, title="Search vs validation vs held-out score")


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
    recorders: Sequence[CommandRecorder] | None = None,
) -> SavedComparison:
    """Write the report files and record them (:func:`comparison_record`) through ``recorders``, by
    default the config's (:func:`opro.tracking.commands.command_recorders`: an MLflow run tagged
    ``opro.kind=comparison`` in ``tracking_uri`` or the config's store, unless ``mlflow`` is off).

    With ``[tracking].genai`` each prompt's evaluation also becomes an MLflow evaluation run
    (per-question traces with the judge's verdict), see :mod:`opro.tracking.genai`.
    """
    out = Path(directory) if directory is not None else default_compare_dir(experiment, name)
    report.write(out)
    plot_survival(report, summary_path=RunDir(experiment.config.output_dir).summary, path=out / "optimism.png")
    if recorders is None:
        from opro.tracking.commands import command_recorders

        recorders = command_recorders(experiment.config, mlflow=mlflow, tracking_uri=tracking_uri)
    params = {k: v for k, v in experiment.run_params().items() if not k.startswith("optimizer.")}
    recorded = record_all(recorders, comparison_record(report, out, params=params))
    evaluation_run_ids: tuple[str, ...] = ()
    if mlflow and experiment.config.tracking.genai:
        from opro.tracking.genai import log_comparison_evaluations

        genai = log_comparison_evaluations(report, experiment=experiment, name=out.name, tracking_uri=tracking_uri,
                                           recorded=recorded)
        evaluation_run_ids = genai.run_ids
    return SavedComparison(directory=out, recorded=recorded, evaluation_run_ids=evaluation_run_ids)


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
                f"prompt_{i}.permutation_p": s.permutation.p_value,
            })
        if v is not None and v.noninferiority is not None:
            metrics[f"prompt_{i}.noninferiority_p"] = v.noninferiority.p_value
    return CommandRecord(
        kind="comparison", name=f"compare {directory.name}", params=all_params, metrics=metrics,
        tags={"opro.split": report.split, "opro.baseline": report.baseline_prompt.label[:250]},
        files={directory: None},
    )


__all__ = [
    "ComparisonReport",
    "PromptScores",
    "SavedComparison",
    "VersusBaseline",
    "compare_prompts",
    "comparison_record",
    "default_compare_dir",
    "plot_comparison",
    "save_comparison",
]
