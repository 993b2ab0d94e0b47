"""A comparison's result and how it reads: per-prompt scores, each prompt against the baseline, the
tables at 80 columns, the markdown / JSON / CSV report and the plots (:func:`opro.heldout.compare.compare_prompts`
makes it)."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.config import SPLIT_NAMES, SplitName
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.program.cost import CostDifference, CostSummary, amount
from opro.program.dimensions import Value
from opro.stats import betting
from opro.stats.noninferiority import NonInferiority
from opro.stats.objectives import COST_FIELD
from opro.stats.paired import ConfidenceInterval, PairedComparison

if TYPE_CHECKING:
    from rich.table import Table

    from opro.evaluation.batch import EvaluationReport

logger = logging.getLogger(__name__)

#: ``opro compare``'s splits in the order it offers them: held-out (its default) first, the dataset's
#: :data:`~opro.data.dataset.SPLIT_NAMES` reversed.
SPLITS: tuple[SplitName, ...] = tuple(reversed(SPLIT_NAMES))


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
    settings: Mapping[str, Value] = field(default_factory=dict)
    #: Means per answered question of its task calls (:mod:`opro.program.cost`).
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
    #: The same configuration as the baseline (template and settings): nothing to compare.
    identical: bool = False

    @property
    def sentence(self) -> str:
        if self.identical:
            return (f"{self.label} vs {self.baseline}: the same configuration (the same template and settings), "
                    "so the same answers: nothing to compare, no difference in quality or cost")
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
    #: What an answer costs, in words (:attr:`opro.program.cost.CostModel.measure`: the measure
    #: ``opro optimize`` uses): weighted task tokens, or USD with prices.
    cost_measure: str = ""

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
                COST_FIELD: None if p.cost is None else p.cost.as_dict(),
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
                    "betting_p": s.test.p_value,
                    "test": betting.METHOD,
                    "min_pairs": s.min_pairs,
                    "n_comparisons": s.n_comparisons,
                    "wilcoxon_p_holm": s.p_wilcoxon,
                    "betting_p_holm": s.p_test,
                    "significant": s.significant,
                    "verdict": v.sentence,
                    "cost_difference": None if v.cost is None else v.cost.as_dict(),
                    "non_inferiority": None if v.noninferiority is None else v.noninferiority.as_dict(),
                    "identical": v.identical,
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
            "cost_measure": self.cost_measure,
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
        """Per prompt, its cells by key (``prompt``, ``mean``, ... ``metric:NAME`` ... ``cost``, ``d_cost``,
        ``tokens``, ``seconds``, ``d_tokens``, ``d_seconds``, and with a margin ``noninferiority``), in the order
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
                row |= {"wtl": "", "diff": "", "p_wilcoxon": "", "p_test": ""}
            elif v.identical:
                row |= {"wtl": "", "diff": "identical", "p_wilcoxon": "", "p_test": ""}
            else:
                s = v.stats
                d = s.difference
                row |= {
                    "wtl": str(s.win_tie_loss),
                    "diff": "n/a" if s.n == 0 else f"{d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]" + _mark(d),
                    "p_wilcoxon": f"{s.p_wilcoxon:.3g}",
                    "p_test": f"{s.p_test:.3g}",
                }
            row |= {f"metric:{m}": _fmt(p.metric_means.get(m)) + (f" ({k} invalid)" if (k := p.metric_invalid.get(m, 0)) else "")
                    for m in self.metric_names}
            row |= dict(zip((COST_FIELD, "d_cost", "tokens", "seconds", "d_tokens", "d_seconds"), _cost_cells(p, v),
                            strict=True))
            if self.margin is not None:
                row["noninferiority"] = "identical" if v is not None and v.identical else self._margin_cells(v)[0]
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
            "betting p" + (" (Holm)" if self.n_comparisons > 1 else ""),
            *self.metric_names,
            f"cost/answer ({self.cost_measure or 'cost'})", f"Δ cost [{lvl} CI]",
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
                         f"Δ mean\n[{lvl} CI]", f"betting p\n(Wilcoxon){holm}"])
        cost = table(f"cost per answer: {self.cost_measure or 'the task call'}",
                     ["#", COST_FIELD, f"Δ cost\n[{lvl} CI]",
                      *([] if self.margin is None else [f"not worse p\n(margin {self.margin:g}){holm}"])])
        raw = table("tokens and seconds per answer (the task call)",
                    ["#", "tokens\n(out)", "seconds", f"Δ tokens\n[{lvl} CI]", f"Δ seconds\n[{lvl} CI]"])
        metrics = table("extra metrics", ["#", *self.metric_names])
        for i, (c, v) in enumerate(zip(self._cells(), self.versus, strict=True), start=1):
            number, baseline = f"#{i}", v is None
            quality.add_row(number, _under(c["mean"]), f"{c['pass']}\n({c['scored']})", c["wtl"],
                            "baseline" if baseline else _under(c["diff"]),
                            f"{c['p_test']}\n({c['p_wilcoxon']})" if c["p_test"] else "")
            cost.add_row(number, c[COST_FIELD], "baseline" if baseline else _under(c["d_cost"]),
                         *([] if self.margin is None else [c["noninferiority"]]))
            raw.add_row(number, _under(c["tokens"]), c["seconds"],
                        "baseline" if baseline else _under(c["d_tokens"]), _under(c["d_seconds"]))
            metrics.add_row(number, *(_under(c[f"metric:{m}"]) for m in self.metric_names))
        return [quality, cost, raw, *([metrics] if self.metric_names else [])]

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
            f"tests two-sided at alpha {self.alpha:g}: the {betting.METHOD} decides, its interval is the difference's, "
            f"both valid whatever the differences' shape on the judge's {SCALE[0]:g}-{SCALE[1]:g} scale (on too few "
            "pairs no difference can be significant: report.json gives min_pairs); the "
            "Wilcoxon signed-rank p-value is shown beside it. Every answer was decoded alone (never in a batch with "
            "another prompt's), so no prompt's score depends on the prompts compared beside it.",
            self.multiplicity(),
        ]
        if self.margin is not None:
            lines.append(f"Non-inferiority margin {self.margin:g} judge points: H0 quality(prompt) - quality(baseline) "
                         f"<= -{self.margin:g}, the one-sided {betting.METHOD}, at alpha {self.alpha:g} (on too few "
                         "pairs no sample can show it: report.json gives min_pairs); cost differences are paired t "
                         "intervals, the share of tokens "
                         "saved Fieller's interval of a ratio of paired means.")
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
    """The cost per answer (the search's measure), tokens (prompt + completion) and seconds per answer,
    and each one's paired difference to the baseline ("identical" for the baseline's configuration)."""
    c, d = p.cost, None if v is None else v.cost

    def diff(text: str) -> str:
        return "" if v is None else "identical" if v.identical else "n/a" if d is None else text

    unit = "tokens" if c is None else c.unit
    return [
        "n/a" if c is None else amount(c.cost, unit),
        diff("" if d is None else amount(d.cost.estimate, unit, signed=True) + (
            "" if d.cost.ci is None else f" [{amount(d.cost.ci[0], unit, signed=True)}, "
                                         f"{amount(d.cost.ci[1], unit, signed=True)}]")),
        "n/a" if c is None else f"{c.prompt_tokens + c.completion_tokens:.0f} ({c.completion_tokens:.0f} out)",
        "n/a" if c is None else f"{c.seconds:.2f}",
        diff("" if d is None else d.tokens.text(0)),
        diff("" if d is None else d.seconds.text(2)),
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
#: step away (:func:`opro.stats.paired.t_mean_ci`).
RESOLUTION = 1.0
#: How compare's intervals are made (the reports say it).
INTERVALS = ("Student t intervals of means (the spread never taken below that of one more score a point from the "
             "mean), within the judge's 1-5 scale, where one reaches an end of the scale its other end the Wilson bound "
             "of a score on that scale; paired differences: the betting confidence sequence's interval")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else (f"{x:.0f}" if digits == 0 else f"{x:.{digits}f}")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def plot_comparison(report: ComparisonReport, path: Path) -> Path:
    """Left: each prompt's scores (jittered) with mean and CI. Right: paired differences vs baseline."""
    from opro.tracking.plots import plot_paired_scores

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
    from opro.tracking.plots import plot_optimism

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


__all__ = [
    "INTERVALS",
    "RESOLUTION",
    "SCALE",
    "SPLITS",
    "ComparisonReport",
    "PromptScores",
    "VersusBaseline",
    "plot_comparison",
    "plot_survival",
]
