"""Promotion: move a Prompt Registry alias to a compared prompt only on held-out evidence.

:func:`promote` reads a :class:`~opro.heldout.report.ComparisonReport`: a held-out comparison whose guard
passed, enough validly scored questions, and a significant gain (or, under a margin, non-inferiority
and a lower cost). The winner is registered through the registry exporter
(:func:`opro.export.export_prompt` with ``format="mlflow"``) and tagged with its held-out figures
(:func:`opro.tracking.mlflow.tag_prompt_version`); every attempt is kept in the decision ledger and
in the output folder, so an alias gets one error budget per held-out set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opro.errors import ConfigError
from opro.paths import RunDir

if TYPE_CHECKING:
    from opro.heldout.report import ComparisonReport, PromptScores, VersusBaseline
    from opro.tracking.workbench import Workbench


@dataclass(frozen=True)
class PromotionDecision:
    """Whether a Prompt Registry alias was moved to a compared prompt, and the figures behind it."""

    alias: str
    granted: bool
    label: str | None
    uri: str | None
    reasons: tuple[str, ...]

    def message(self) -> str:
        if self.granted:
            return f"promoted {self.label} to alias {self.alias!r} ({self.uri}): " + "; ".join(self.reasons)
        return f"refused to move alias {self.alias!r}: " + "; ".join(self.reasons)


#: Share of the held-out questions both prompts must have a valid score on before a promotion: a
#: judge that could not read most of a prompt's answers leaves a comparison of the few it could.
MIN_PROMOTION_COVERAGE = 0.9


def promote(
    report: ComparisonReport, *, experiment: Workbench, alias: str, tracking_uri: str | None = None,
    min_coverage: float = MIN_PROMOTION_COVERAGE,
) -> PromotionDecision:
    """Move ``alias`` to the best compared prompt only if it beats the baseline on held-out questions.

    Required: a held-out comparison whose leakage check passed, valid scores of both prompts on at
    least ``min_coverage`` of the held-out questions (pairs are dropped where either judgment is
    invalid), and a positive mean difference that the two-sided betting test calls
    significant at the report's alpha (Holm-adjusted when several prompts were compared); under a
    margin (``compare_prompts(margin=...)``) instead its non-inferiority test (Holm) and a cost per
    answer whose paired interval lies below 0. Among prompts that qualify, the one with the highest
    held-out mean wins (under a margin, the cheapest); it is registered as a new
    version tagged with its held-out figures (alpha, n, coverage, p, the family), then the alias
    points at it.

    Every attempt is recorded, in the user's decision ledger (shared by every output
    folder of that dataset) and in ``promotions.json`` in the output folder. An alias gets one
    attempt per held-out set, across output folders: a later one on the same questions (more than
    :data:`opro.search.ledger.MAX_SEEN_SHARE` of them) with other prompts, another baseline, alpha or margin
    is refused (it would be a new chance at a false promotion, outside the error budget of the
    first); the same attempt may be repeated exactly, and a fresh held-out set starts a new budget.
    """
    if not 0.0 < min_coverage <= 1.0:
        raise ConfigError(f"min_coverage must be in (0, 1] (e.g. 0.9), got {min_coverage}")
    if report.split != "heldout" or not report.leakage_checked:  # refused as no attempt at all
        return _promote(report, experiment=experiment, alias=alias, tracking_uri=tracking_uri, min_coverage=min_coverage)
    attempt = _promotion_attempt(report, alias=alias, registry=experiment.config.prompt_name, min_coverage=min_coverage)
    run = RunDir(experiment.config.output_dir)
    # promotions.json first: attempts made before the ledger existed are only there.
    earlier = [a for a in run.read_promotions()
               if (a.get("registry"), a.get("alias"), a.get("questions")) == (attempt["registry"], alias, attempt["questions"])]
    if earlier and not any(a.get("family") == attempt["family"] for a in earlier):
        # One error budget per alias and held-out set: another family of prompts (or another alpha)
        # on the same questions would be a fresh chance at a false promotion.
        last = earlier[-1]
        return _refused_again(alias, shared=len(report.questions), n=len(report.questions), where="this output folder",
                              at=last.get("at"), prompts=last.get("prompts", []), alpha=last.get("alpha"),
                              verdict="granted" if last.get("granted") else "refused")
    from opro.data.dataset import question_hashes
    from opro.search.ledger import Decision

    entry = Decision(
        scope=f"promotion {attempt['registry']}@{alias}", key=attempt["family"],
        questions=question_hashes(report.questions),
        design={k: attempt[k] for k in ("prompts", "baseline", "alpha", "min_coverage", "margin") if k in attempt},
        at=attempt["at"],
    )
    seen = experiment.decisions.begin(entry)
    if seen is not None:
        return _refused_again(alias, shared=entry.seen_share(seen)[0], n=len(report.questions), where=seen.where,
                              at=seen.at, prompts=seen.design.get("prompts", []), alpha=seen.design.get("alpha"),
                              verdict=seen.verdict or "not finished")
    decision = _promote(report, experiment=experiment, alias=alias, tracking_uri=tracking_uri, min_coverage=min_coverage)
    run.add_promotion({**attempt, "granted": decision.granted, "promoted": decision.label, "uri": decision.uri})
    experiment.decisions.settle(replace(
        entry, verdict=f"granted: {decision.label} ({decision.uri})" if decision.granted else "refused"))
    return decision


def _refused_again(alias: str, *, shared: int, n: int, where: str, at: Any, prompts: Sequence[str], alpha: Any,
                   verdict: str) -> PromotionDecision:
    """The refusal of a second promotion attempt on held-out questions an earlier one decided on."""
    from opro.search.ledger import MAX_SEEN_SHARE

    on = f"these {n}" if shared == n else f"{shared} of these {n}"
    return PromotionDecision(alias, False, None, None, (
        f"alias {alias!r} already had a promotion attempt on {on} held-out questions ({where}, {at}: "
        f"{', '.join(prompts)} at alpha {alpha}, {verdict}); another attempt on the same questions with other "
        "prompts, another alpha or another margin would spend the error budget again. Use a fresh held-out set (more data; a new "
        f"[data.split].seed only where at most {MAX_SEEN_SHARE:.0%} of its held-out questions were in this one), "
        "or repeat that attempt exactly",
    ))


def _promotion_attempt(report: ComparisonReport, *, alias: str, registry: str, min_coverage: float) -> dict[str, Any]:
    """What identifies a promotion attempt: the alias, the held-out questions, and the family (the
    compared templates, the baseline, alpha, the coverage rule and, under ``--margin``, the margin)."""
    from opro.data.dataset import normalize_question, question_hash
    from opro.hashing import sha

    questions = sha(repr(sorted(question_hash(normalize_question(q)) for q in report.questions)))
    # Settings only where there are some: attempts recorded before settings existed keep their keys.
    prompts = sorted(f"{p.label}={sha(p.template_text + (repr(sorted(p.settings.items())) if p.settings else ''))}"
                     for p in report.prompts)
    family: tuple[Any, ...] = (prompts, report.baseline_prompt.label, report.alpha, min_coverage)
    # The margin only where there is one: attempts recorded before margins existed keep their family.
    margin = {} if report.margin is None else {"margin": report.margin}
    return {
        "at": datetime.now().isoformat(timespec="seconds"), "registry": registry, "alias": alias,
        "questions": questions, "n_questions": len(report.questions), "prompts": prompts,
        "baseline": report.baseline_prompt.label, "alpha": report.alpha, "min_coverage": min_coverage, **margin,
        "family": sha(repr(family if report.margin is None else (*family, report.margin))),
    }


def _promote(
    report: ComparisonReport, *, experiment: Workbench, alias: str, tracking_uri: str | None, min_coverage: float
) -> PromotionDecision:
    from opro.export import export_prompt
    from opro.export.sources import resolve_prompt

    if report.split != "heldout" or not report.leakage_checked:
        return PromotionDecision(alias, False, None, None, (
            f"the comparison ran on the {report.split!r} split"
            + ("" if report.leakage_checked else " without a passed held-out leakage check")
            + "; only a held-out comparison can promote a prompt",
        ))
    qualified, reasons = _qualified(report, min_coverage=min_coverage)
    if not qualified:
        return PromotionDecision(alias, False, None, None, tuple(reasons))
    if report.margin is not None:  # as good and cheaper: the cheapest of those that qualify
        best, v = min(qualified, key=lambda pv: pv[1].cost.cost.estimate if pv[1].cost is not None else math.inf)
    else:
        best, v = max(qualified, key=lambda pv: pv[0].mean.estimate if pv[0].mean is not None else -math.inf)
    resolved = resolve_prompt(best.spec, config=experiment.config, tracking_uri=tracking_uri)
    exported = export_prompt(resolved, format="mlflow", alias=alias, config=experiment.config,
                             tracking_uri=tracking_uri)
    from opro.tracking.mlflow import tag_prompt_version

    assert exported.version is not None  # the MLflow exporter always registers a version
    tag_prompt_version(tracking_uri=tracking_uri or experiment.config.mlflow_uri, name=experiment.config.prompt_name,
                       version=exported.version, tags=_heldout_tags(report, best, v))
    return PromotionDecision(alias, True, best.label, exported.uri, tuple(reasons))


def _qualified(report: ComparisonReport, *, min_coverage: float
               ) -> tuple[list[tuple[PromptScores, VersusBaseline]], list[str]]:
    """The compared prompts that qualify for promotion, and each prompt's figures and why it does not."""
    reasons: list[str] = []
    qualified: list[tuple[PromptScores, VersusBaseline]] = []
    for p, v in zip(report.prompts, report.versus, strict=True):
        if v is None:
            continue
        s = v.stats
        d = s.difference
        figures = (
            f"{p.label}: difference {d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}] over {s.n} held-out questions, "
            f"betting test p={s.p_test:.3g}, Wilcoxon p={s.p_wilcoxon:.3g}"
            + (f" (Holm, {s.n_comparisons} comparisons)" if s.n_comparisons > 1 else "")
        )
        if v.identical:  # the baseline itself under another name: there is nothing to promote
            reasons.append(f"{p.label}: the same configuration as the baseline (the same template and settings): "
                           "nothing to promote")
            continue
        source = report.leakage_by_prompt.get(p.label, "")
        if source.startswith("unchecked"):
            reasons.append(f"{p.label}: held-out leakage {source}; only a prompt whose tuning questions are known "
                           "can be promoted (compare it from its run, or export it yourself)")
            continue
        coverage = s.n / len(report.questions) if report.questions else 0.0
        figures += f", {s.n} of {len(report.questions)} questions scored validly for both ({coverage:.0%})"
        if coverage < min_coverage:
            reasons.append(figures + f": below the {min_coverage:.0%} coverage a promotion needs (fix the judge's "
                                     "invalid replies and compare again)")
            continue
        if report.margin is not None:
            # Under a margin the claim is "as good and cheaper": non-inferiority and a lower cost.
            ni, c = v.noninferiority, v.cost
            figures += (f", non-inferiority by {report.margin:g} p={ni.p:.3g}" if ni is not None else "")
            figures += "" if c is None else f", cost per answer {c.cost.text(3 if c.baseline_cost < 1 else 0)}"
            why = ("" if ni is not None and ni.passed else f": {ni.text()}" if ni is not None and ni.too_few else
                   f": not shown to be worse by less than {report.margin:g} at alpha {report.alpha:g}")
            if not why and (c is None or not c.lower):
                why = ": not worse by more than the margin, but its cost per answer is not lower (interval not below 0)"
            ok = not why
            reasons.append(figures + why)
        else:
            ok = s.n > 0 and d.estimate > 0 and s.significant
            reasons.append(figures + ("" if ok else f": not a significant gain at alpha {report.alpha:g}"))
        if ok:
            qualified.append((p, v))
    return qualified, reasons


def _heldout_tags(report: ComparisonReport, best: PromptScores, v: VersusBaseline) -> dict[str, str]:
    """The promoted version's tags: its held-out figures, the test, the family and its cost."""
    d = v.stats.difference
    return {
        "opro.heldout_mean": f"{best.mean.estimate:.4f}" if best.mean is not None else "",
        "opro.heldout_difference": f"{d.estimate:.4f}",
        "opro.heldout_ci": f"[{d.low:.4f}, {d.high:.4f}]",
        "opro.heldout_n": str(v.stats.n),
        "opro.heldout_questions": str(len(report.questions)),
        "opro.heldout_coverage": f"{v.stats.n / len(report.questions):.4f}",
        "opro.heldout_alpha": f"{report.alpha:g}",
        "opro.heldout_test": "two-sided betting confidence sequence",
        "opro.heldout_family": str(v.stats.n_comparisons),
        "opro.heldout_p_wilcoxon": f"{v.stats.p_wilcoxon:.4g}",
        "opro.heldout_p_betting": f"{v.stats.p_test:.4g}",
        "opro.heldout_baseline": v.baseline[:250],
        **({} if report.margin is None or v.noninferiority is None else {
            "opro.heldout_margin": f"{report.margin:g}",
            "opro.heldout_test": "one-sided betting confidence sequence, non-inferiority by the margin",
            "opro.heldout_p_noninferiority": f"{v.noninferiority.p:.4g}",
        }),
        # Its cost per answer on these held-out questions, and the paired differences to the baseline.
        **({} if best.cost is None else {
            "opro.heldout_tokens_per_answer": f"{best.cost.prompt_tokens + best.cost.completion_tokens:.1f}",
            "opro.heldout_seconds_per_answer": f"{best.cost.seconds:.3f}",
            "opro.heldout_cost_per_answer": f"{best.cost.cost:.6g}",
            "opro.heldout_cost_unit": best.cost.unit,
        }),
        **({} if v.cost is None else {
            "opro.heldout_cost_difference": f"{v.cost.cost.estimate:.6g}",
            "opro.heldout_tokens_difference": f"{v.cost.tokens.estimate:.1f}",
            "opro.heldout_seconds_difference": f"{v.cost.seconds.estimate:.3f}",
        }),
    }


__all__ = ["MIN_PROMOTION_COVERAGE", "PromotionDecision", "promote"]
