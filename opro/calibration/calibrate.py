"""Judge calibration: does the correctness judge tell right answers from wrong ones, and how noisy is it?

For questions of a labelled dataset the judge scores three kinds of answers:

- ``reference``: the reference answer itself (should score high),
- ``wrong``: the reference answer of another question (a cyclic shift, so never its own),
- ``task``: the task model's answers through the RAG program (somewhere in between),
- near misses, the reference with one fact made wrong, made without a model (:mod:`opro.calibration.nearmiss`):
  ``number`` (one number changed), ``name`` (one name swapped for a name from another reference),
  ``first-sentence`` (the reference cut to its first sentence); a question whose reference has no
  number, no name or one sentence only has no answer of that condition. They are what separates two
  good prompts: a judge that tells the reference from another question's answer may still miss them.

:func:`calibrate_experiment` returns a :class:`CalibrationReport`: per-condition mean and score
distribution, invalid replies, the AUC of reference vs wrong (the probability that a right answer
outscores a wrong one, ties counted half), their separation, per condition the contrast with the
reference (:class:`ContrastStats`: AUC, paired win rate, mean drop), seconds per uncached call and the
test-retest agreement of repeated (uncached) calls. :func:`write_calibration` stores it in the run's output
folder, where ``opro optimize`` and ``opro compare`` read it to print the judge's measured noise
beside their gains (:func:`judge_noise_note`).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.calibration.nearmiss import NEAR_MISSES, near_misses
from opro.errors import ConfigError, DataError
from opro.llm import UsageLedger
from opro.paths import CALIBRATION_DIR, CALIBRATION_FILE, RunDir
from opro.search.records import CommandRecord, finite_metrics

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.data.dataset import Example
    from opro.judges import CorrectnessJudge
    from opro.tracking.workbench import Workbench

#: The conditions judged since the first calibrations (the retest repeats answers of these).
BASE_CONDITIONS: tuple[str, ...] = ("reference", "wrong", "task")
#: Every condition, in the order a question's answers are judged; all of them by default.
CONDITIONS: tuple[str, ...] = (*BASE_CONDITIONS, *NEAR_MISSES)


@dataclass(frozen=True)
class CalibrationItem:
    """One answer to judge: ``question`` indexes the sampled questions."""

    condition: str
    question: int
    query: str
    reference: str
    answer: str


@dataclass(frozen=True)
class CalibrationVerdict:
    item: CalibrationItem
    score: float | None
    invalid_reason: str | None
    latency_s: float
    cached: bool
    #: 0: the calibration call; 1: its repeat without the cache (test-retest).
    repeat: int = 0
    #: Logit judges: the most likely score (the discrete score a generated reply would give).
    most_likely: int | None = None


@dataclass(frozen=True)
class ConditionStats:
    condition: str
    n: int
    n_invalid: int
    mean: float | None
    #: Scores rounded half up onto 1..5.
    distribution: dict[int, int]


@dataclass(frozen=True)
class ContrastStats:
    """The reference against one other condition, on the questions that have both.

    ``auc``: P(reference outscores the condition's answer), over the reference scores of those
    questions and the condition's scores, ties counted half (for ``wrong`` it is the report's ``auc``).
    ``pairs``: questions where both answers have a score; ``wins``/``ties``: of those, where the
    reference scored higher / the same. ``win_rate``: (wins + ties / 2) / pairs, ties counted half as in
    the AUC. ``mean_drop``: the mean of reference minus the condition's answer over the pairs.
    """

    condition: str
    pairs: int
    wins: int
    ties: int
    auc: float | None
    win_rate: float | None
    mean_drop: float | None


@dataclass(frozen=True)
class RetestStats:
    """Agreement of the same judge call made twice (the second without the cache)."""

    n: int
    exact: float | None
    within_1: float | None
    mean_abs_difference: float | None
    #: Standard deviation of one call's score around its repeat's: sd(first - second) / sqrt(2).
    sd: float | None


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


@dataclass(frozen=True)
class CalibrationReport:
    judge: str
    method: str
    dataset: str
    n_questions: int
    seed: int
    conditions: tuple[ConditionStats, ...]
    auc: float | None
    separation: float | None
    invalid_rate: float | None
    #: Logit judges: the AUC of the most likely score alone (what the discrete score would separate).
    auc_most_likely: float | None
    #: Mean seconds of one judge call, as recorded when it was made (cache hits keep that figure).
    s_per_call: float | None
    calls: int
    cache_hits: int
    retest: RetestStats | None
    #: The judge settings it was measured with (see :func:`judge_signature`).
    signature: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    #: The reference against every other condition (empty in calibrations written before them).
    contrasts: tuple[ContrastStats, ...] = ()

    def condition(self, name: str) -> ConditionStats | None:
        return next((c for c in self.conditions if c.condition == name), None)

    def contrast(self, name: str) -> ContrastStats | None:
        """The reference against condition ``name`` (None for the reference or a condition not judged)."""
        return next((c for c in self.contrasts if c.condition == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rich_table(self) -> Any:
        """Answers, invalid replies, mean and score distribution per condition."""
        from rich.table import Table

        table = Table(title=f"judge calibration: {self.judge} ({self.method}), {self.n_questions} questions of {self.dataset}")
        for col in ("condition", "answers", "invalid", "mean", "scores 1/2/3/4/5"):
            table.add_column(col, justify="left" if col == "condition" else "right")
        for c in self.conditions:
            table.add_row(c.condition, str(c.n), str(c.n_invalid), _fmt(c.mean), "/".join(str(c.distribution[k]) for k in range(1, 6)))
        return table

    def contrast_table(self) -> Any:
        """The reference against each other condition: AUC, how often it scored higher, the mean drop."""
        from rich.table import Table

        table = Table(title="the reference against each condition, on the questions that have both")
        for col in ("condition", "pairs", "AUC", "reference higher", "win rate", "mean drop"):
            table.add_column(col, justify="left" if col == "condition" else "right")
        for k in self.contrasts:
            table.add_row(k.condition, str(k.pairs), _fmt(k.auc, ".3f"),
                          f"{k.wins}" + (f" (+{k.ties} tied)" if k.ties else ""), _fmt(k.win_rate), _fmt(k.mean_drop))
        table.caption = "win rate: the share of pairs where the reference scored higher (ties half)"
        return table

    def near_miss_lines(self) -> list[str]:
        """One line per near-miss condition judged: how many questions had one, and how the judge told it
        from the reference."""
        lines = []
        for name in NEAR_MISSES:
            c, k = self.condition(name), self.contrast(name)
            if c is None:
                continue
            had = f"{c.n} of {self.n_questions} questions {_NEAR_MISS_APPLIES[name]}"
            if k is None or not k.pairs:
                lines.append(f"near miss {name}: {had}; nothing to compare")
                continue
            lines.append(
                f"near miss {name} ({had}): AUC {_fmt(k.auc, '.3f')}, reference higher in {k.wins} of "
                f"{k.pairs} pairs" + (f" ({k.ties} tied)" if k.ties else "")
                + f", win rate {_fmt(k.win_rate)} (ties half), mean drop {_fmt(k.mean_drop)}"
            )
        return lines

    def lines(self) -> list[str]:
        """Separation, invalid rate, cost, test-retest noise and the near misses, one line each."""
        f, retest = _fmt, self.retest
        lines = [
            f"AUC reference vs wrong: {f(self.auc, '.3f')}   separation: {f(self.separation)}"
            + (f"   (most likely score alone: AUC {f(self.auc_most_likely, '.3f')})" if self.auc_most_likely is not None else ""),
            f"invalid replies: {f(self.invalid_rate, '.1%')}",
            f"seconds per uncached judge call: {f(self.s_per_call)} ({self.calls} calls, {self.cache_hits} cache hits)",
        ]
        if retest is not None:
            lines.append(
                f"test-retest ({retest.n} repeated calls without the cache): exact {f(retest.exact, '.0%')}, "
                f"within 1 {f(retest.within_1, '.0%')}, mean |difference| {f(retest.mean_abs_difference, '.3f')}, "
                f"sd per call {f(retest.sd, '.3f')}"
            )
        return lines + self.near_miss_lines()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "calibration") -> CalibrationReport:
        try:
            conditions = tuple(
                ConditionStats(**{**c, "distribution": {int(k): int(v) for k, v in c["distribution"].items()}})
                for c in data["conditions"]
            )
            retest = RetestStats(**data["retest"]) if data.get("retest") else None
            contrasts = tuple(ContrastStats(**c) for c in data.get("contrasts") or ())
            # Fields a later opro added are left out, so this one still reads its files.
            known = {f.name for f in fields(cls)}
            return cls(**{**{k: v for k, v in data.items() if k in known}, "conditions": conditions,
                          "retest": retest, "contrasts": contrasts})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{where} is not an opro judge calibration ({exc}); rerun `opro judge calibrate`") from exc

    def summary(self) -> str:
        def f(x: float | None, spec: str = ".2f") -> str:
            return "n/a" if x is None else format(x, spec)

        ref, wrong = self.condition("reference"), self.condition("wrong")
        parts = [
            f"AUC right vs wrong {f(self.auc)}",
            f"reference {f(ref.mean if ref else None)} vs wrong {f(wrong.mean if wrong else None)} "
            f"(separation {f(self.separation)})",
            f"invalid {f(self.invalid_rate, '.1%')}",
        ]
        if self.retest is not None:
            parts.append(f"test-retest sd {f(self.retest.sd)} (exact {f(self.retest.exact, '.0%')}, n={self.retest.n})")
        if self.s_per_call is not None:
            parts.append(f"{self.s_per_call:.2f} s/call")
        if self.auc_most_likely is not None:
            parts.append(f"AUC of the most likely score alone {f(self.auc_most_likely)}")
        near = [(name, k) for name in NEAR_MISSES if (k := self.contrast(name)) is not None and k.pairs]
        if near:
            parts.append("near misses: " + ", ".join(
                f"{name} AUC {f(k.auc)} (drop {f(k.mean_drop)}, n={k.pairs})" for name, k in near))
        return f"{self.n_questions} questions of {self.dataset}: " + ", ".join(parts)


_NEAR_MISS_APPLIES = {
    "number": "have a number in the reference",
    "name": "have a name in the reference",
    "first-sentence": "have a reference of two or more sentences",
}


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """P(positive > negative) + P(tie) / 2: the Mann-Whitney AUC; None when either side is empty."""
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def build_items(
    examples: Sequence[Example],
    *,
    task_answers: Sequence[str] | None = None,
    near_miss: Sequence[str] = (),
    pool: Sequence[str] | None = None,
    seed: int = 0,
) -> list[CalibrationItem]:
    """Reference, wrong (the next question's reference), when given task-model items and the
    ``near_miss`` conditions that apply (seeded; names drawn from ``pool``, reference texts, default
    the examples' own references), by question."""
    if len(examples) < 2:
        raise DataError(f"judge calibration needs at least 2 questions (wrong answers come from another); got {len(examples)}")
    if task_answers is not None and len(task_answers) != len(examples):
        raise DataError(f"{len(task_answers)} task answers for {len(examples)} questions")
    unknown = [c for c in near_miss if c not in NEAR_MISSES]
    if unknown:
        raise ConfigError(f"unknown near-miss condition(s) {unknown}: use {', '.join(NEAR_MISSES)}")
    references = [ex.reference_answer for ex in examples]
    misses = near_misses(references, pool=pool, seed=seed, conditions=near_miss) if near_miss else None
    items: list[CalibrationItem] = []
    n = len(examples)
    # Grouped by question: the judge prompt's prefix up to the answer is shared, so llama.cpp's KV
    # cache evaluates it once per question.
    for i, ex in enumerate(examples):
        answers = {"reference": ex.reference_answer, "wrong": examples[(i + 1) % n].reference_answer}
        if task_answers is not None:
            answers["task"] = task_answers[i]
        if misses is not None:
            answers.update(misses[i])
        for condition, answer in answers.items():
            items.append(CalibrationItem(condition, i, ex.query, ex.reference_answer, answer))
    return items


def _category(score: float) -> int:
    return min(max(int(score + 0.5), 1), 5)


def _retest(pairs: Sequence[tuple[float, float]]) -> RetestStats:
    n = len(pairs)
    if not n:
        return RetestStats(0, None, None, None, None)
    diffs = [a - b for a, b in pairs]
    return RetestStats(
        n=n,
        exact=sum(_category(a) == _category(b) for a, b in pairs) / n,
        within_1=sum(abs(_category(a) - _category(b)) <= 1 for a, b in pairs) / n,
        mean_abs_difference=sum(abs(d) for d in diffs) / n,
        sd=math.sqrt(sum(d * d for d in diffs) / n / 2),
    )


def summarize(
    verdicts: Sequence[CalibrationVerdict],
    *,
    judge: str,
    method: str,
    dataset: str,
    seed: int,
    signature: Mapping[str, Any] | None = None,
    requested: Sequence[str] = (),
) -> CalibrationReport:
    """The statistics of a list of verdicts (pure: unit-testable without a model). ``requested``:
    conditions reported even where no question had an answer of theirs (a near miss that never applied)."""
    first = [v for v in verdicts if v.repeat == 0]
    if not first:
        raise DataError("no judge verdicts to summarize")
    conditions = [c for c in CONDITIONS if c in requested or any(v.item.condition == c for v in first)]
    scores = {c: [v.score for v in first if v.item.condition == c and v.score is not None] for c in conditions}
    stats = tuple(
        ConditionStats(
            condition=c,
            n=sum(v.item.condition == c for v in first),
            n_invalid=sum(v.item.condition == c and v.score is None for v in first),
            mean=statistics.fmean(scores[c]) if scores[c] else None,
            distribution={k: Counter(_category(s) for s in scores[c]).get(k, 0) for k in range(1, 6)},
        )
        for c in conditions
    )
    means = {s.condition: s.mean for s in stats}
    ref_mean, wrong_mean = means.get("reference"), means.get("wrong")
    # A cached verdict carries the latency recorded when its call was made, so a report rebuilt from
    # the cache still says what a call cost.
    latencies = [v.latency_s for v in verdicts if v.latency_s > 0]
    repeats = {(v.item.condition, v.item.question): v for v in verdicts if v.repeat == 1}
    pairs = [
        (v.score, r.score)
        for v in first
        if (r := repeats.get((v.item.condition, v.item.question))) is not None
        and v.score is not None
        and r.score is not None
    ]
    return CalibrationReport(
        judge=judge,
        method=method,
        dataset=dataset,
        n_questions=len({v.item.question for v in first}),
        seed=seed,
        conditions=stats,
        auc=auc(scores.get("reference", []), scores.get("wrong", [])),
        auc_most_likely=auc(
            [float(v.most_likely) for v in first if v.item.condition == "reference" and v.most_likely is not None],
            [float(v.most_likely) for v in first if v.item.condition == "wrong" and v.most_likely is not None],
        ),
        separation=ref_mean - wrong_mean if ref_mean is not None and wrong_mean is not None else None,
        invalid_rate=sum(v.score is None for v in first) / len(first),
        s_per_call=statistics.fmean(latencies) if latencies else None,
        calls=sum(not v.cached for v in verdicts),
        cache_hits=sum(v.cached for v in verdicts),
        retest=_retest(pairs) if repeats else None,
        signature=dict(signature or {}),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        contrasts=tuple(_contrast(first, c) for c in conditions if c != "reference"),
    )


def _contrast(first: Sequence[CalibrationVerdict], condition: str) -> ContrastStats:
    """The reference against ``condition`` on the questions that have both (see :class:`ContrastStats`)."""
    reference = {v.item.question: v.score for v in first if v.item.condition == "reference"}
    other = {v.item.question: v.score for v in first if v.item.condition == condition}
    pairs = [(r, o) for q, o in other.items() if (r := reference.get(q)) is not None and o is not None]
    wins = sum(r > o for r, o in pairs)
    ties = sum(r == o for r, o in pairs)
    return ContrastStats(
        condition=condition,
        pairs=len(pairs),
        wins=wins,
        ties=ties,
        auc=auc([s for q in other if (s := reference.get(q)) is not None], [s for s in other.values() if s is not None]),
        win_rate=(wins + ties / 2) / len(pairs) if pairs else None,
        mean_drop=statistics.fmean(r - o for r, o in pairs) if pairs else None,
    )


def _judge_one(judge: CorrectnessJudge, item: CalibrationItem, repeat: int) -> CalibrationVerdict:
    from opro.judges import score_distribution

    started = time.perf_counter()
    result, completion = judge.evaluate_with_completion(query=item.query, answer=item.answer, reference=item.reference)
    most_likely = None
    if completion is not None and completion.finish_reason == "choices" and result.score is not None:
        dist = score_distribution(completion)
        most_likely = max(dist, key=lambda s: dist[s]) if dist else None
    return CalibrationVerdict(
        most_likely=most_likely,
        item=item,
        score=result.score,
        invalid_reason=result.invalid_reason,
        latency_s=completion.latency_s if completion is not None else time.perf_counter() - started,
        cached=bool(completion is not None and completion.cached),
        repeat=repeat,
    )


def run_judge(
    judge: CorrectnessJudge, items: Sequence[CalibrationItem], *, retest: int = 0, progress: bool = True
) -> list[CalibrationVerdict]:
    """Judge every item, then repeat the first ``retest`` items of each of reference, wrong and task
    without the cache (near misses are not repeated: the judge's noise is its own, whatever it reads).

    The repeats measure the judge's own noise (a greedy llama.cpp judge is close to deterministic;
    a sampled or remote judge is not); they are never stored, so a rerun repeats them again.
    """
    from opro.progress import progress_bar

    conditions = [c for c in BASE_CONDITIONS if any(i.condition == c for i in items)]
    again = [i for c in conditions for i in [i for i in items if i.condition == c][:retest]]
    uncached = copy_judge_without_cache(judge) if again else None
    verdicts: list[CalibrationVerdict] = []
    with progress_bar("judge calibration", total=len(items) + len(again), enabled=progress) as bar:
        for item in items:
            verdicts.append(_judge_one(judge, item, 0))
            bar.advance()
        for item in again:
            assert uncached is not None
            verdicts.append(_judge_one(uncached, item, 1))
            bar.advance()
    return verdicts


def copy_judge_without_cache(judge: CorrectnessJudge) -> CorrectnessJudge:
    """The same judge on a client without the call cache (its calls counted in a ledger of its own)."""
    import copy

    twin = copy.copy(judge)
    twin.llm = replace(judge.llm, cache=None, usage=UsageLedger())
    return twin


def calibrate_experiment(
    experiment: Workbench,
    *,
    n: int = 40,
    seed: int | None = None,
    conditions: Sequence[str] = CONDITIONS,
    retest: int = 5,
    progress: bool = True,
) -> tuple[CalibrationReport, list[CalibrationVerdict]]:
    """Calibrate an experiment's judge on ``n`` seeded questions of its dataset (all splits: the judge
    is not what the search tunes). Task answers come from its RAG program with the first initial
    instruction; near misses from the references (names from the references of the whole dataset, so a
    question's near misses do not depend on ``n``). Every call goes through the experiment's call cache,
    except the retest repeats."""
    import random

    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown or not {"reference", "wrong"} <= set(conditions):
        raise ConfigError(
            f"calibration conditions {list(conditions)}: use reference and wrong, optionally "
            f"{', '.join(c for c in CONDITIONS if c not in ('reference', 'wrong'))} (unknown: {unknown})"
        )
    if n < 2:
        raise ConfigError(f"judge calibration needs --n >= 2 questions, got {n}")
    if retest < 0:
        raise ConfigError(f"--retest must be >= 0, got {retest}")
    config = experiment.config
    seed = config.experiment.seed if seed is None else seed
    examples = list(experiment.dataset.examples)
    if len(examples) < 2:
        raise DataError(f"{config.source}: the dataset has {len(examples)} question(s); calibration needs at least 2")
    # A seeded order of all questions, cut at n: a smaller n is a prefix of a larger one, so a rerun
    # with fewer (or more) questions reuses every cached call.
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    chosen = [examples[i] for i in order[:n]]
    answers = None
    if "task" in conditions:
        template = experiment.template(config.rag.initial_instructions[0])
        answers = [
            a.text for a in experiment.program.answer_many([e.query for e in chosen], template=template, progress=progress)
        ]
    items = build_items(chosen, task_answers=answers, near_miss=[c for c in NEAR_MISSES if c in conditions],
                        pool=[e.reference_answer for e in examples], seed=seed)
    judge = experiment.judge
    verdicts = run_judge(judge, items, retest=retest, progress=progress)
    report = summarize(
        verdicts,
        judge=judge.llm.model,
        method=judge.method,
        dataset=config.data.dataset or ", ".join(config.data.docs),
        seed=seed,
        signature=judge_signature(config),
        requested=conditions,
    )
    return report, verdicts


def _key(condition: str) -> str:
    return condition.replace("-", "_")


def calibration_record(report: CalibrationReport, paths: Mapping[str, Path]) -> CommandRecord:
    """The calibration as one command record (``opro.kind = judge-calibration``): the statistics and the files."""
    params: dict[str, Any] = {f"judge.{k}": v for k, v in report.signature.items()}
    params.update({"calibration.n_questions": report.n_questions, "calibration.seed": report.seed,
                   "calibration.dataset": report.dataset, "judge.method": report.method})
    metrics = finite_metrics({
        "judge_auc": report.auc,
        "judge_separation": report.separation,
        "judge_invalid_rate": report.invalid_rate,
        "judge_s_per_call": report.s_per_call,
        "judge_retest_sd": report.retest.sd if report.retest else None,
        "judge_retest_exact": report.retest.exact if report.retest else None,
        **{f"judge_mean_{_key(c.condition)}": c.mean for c in report.conditions},
        **{f"judge_{stat}_{_key(k.condition)}": getattr(k, stat)
           for k in report.contrasts for stat in ("auc", "win_rate", "mean_drop")},
        **{f"judge_pairs_{_key(k.condition)}": k.pairs for k in report.contrasts},
    })
    return CommandRecord(kind="judge-calibration", name="judge-calibration", params=params, metrics=metrics,
                         files={path: "judge_calibration" for path in paths.values()})


# --- where calibrations live, and how runs report them ---------------------------------------------


def judge_signature(config: OproConfig) -> dict[str, Any]:
    """The settings that make two judges the same judge (model spec without secrets, [judge] table)."""
    j = config.judge
    signature = {
        "model": config.models.judge.safe_dict(),
        "template": j.template,
        "structured": j.structured,
        "max_tokens": j.max_tokens,
        "score_from": j.score_from,
    }
    # As stored in JSON, so a loaded signature compares equal to a fresh one.
    loaded: dict[str, Any] = json.loads(json.dumps(signature, default=str))
    return loaded


def write_calibration(
    report: CalibrationReport, verdicts: Sequence[CalibrationVerdict], *, output_dir: Path, plot: bool = True
) -> dict[str, Path]:
    """``<output_dir>/judge_calibration.json`` (read by optimize / compare) and, in
    ``<output_dir>/judge_calibration/``, every verdict as CSV and the score-distribution plot."""
    from opro.redaction import redact_text

    run = RunDir(output_dir)
    detail = run.calibration_dir
    detail.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {
        "summary": run.calibration,
        "verdicts": detail / "verdicts.csv",
        "retest": detail / "retest.csv",
    }
    paths["summary"].write_text(redact_text(json.dumps(report.to_dict(), indent=2)), encoding="utf-8")
    # verdicts.csv has the columns `opro judge agreement --answers` reads (query, answer, reference,
    # score), so another judge can be compared on the same answers.
    for key, repeat in (("verdicts", 0), ("retest", 1)):
        with paths[key].open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["condition", "question", "score", "most_likely", "invalid_reason", "latency_s", "cached",
                             "query", "reference", "answer"])
            for v in verdicts:
                if v.repeat != repeat:
                    continue
                writer.writerow([
                    v.item.condition, v.item.question, "" if v.score is None else f"{v.score:.4f}",
                    "" if v.most_likely is None else v.most_likely, v.invalid_reason or "", f"{v.latency_s:.3f}", v.cached, v.item.query, v.item.reference, v.item.answer,
                ])
    if plot:
        paths["plot"] = plot_calibration(verdicts, path=detail / "score_distributions.png", title=report.method)
    return paths


def plot_calibration(verdicts: Sequence[CalibrationVerdict], *, path: Path, title: str) -> Path:
    """Histogram of the judge's scores per condition (first verdicts only, not the retests)."""
    from opro.tracking.plots import plot_score_histograms

    groups = {
        c: [v.score for v in verdicts if v.repeat == 0 and v.item.condition == c and v.score is not None]
        for c in CONDITIONS
    }
    return plot_score_histograms(groups, path=path, title=title)


def load_calibration(output_dir: Path) -> CalibrationReport | None:
    """The calibration stored in a run's output folder, or None when there is none."""
    path = RunDir(output_dir).calibration
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({exc}); rerun `opro judge calibrate`") from exc
    return CalibrationReport.from_dict(data, where=str(path))


def judge_noise_note(config: OproConfig) -> str:
    """One line for a run's summary: the judge's measured noise, or how to measure it."""
    hint = f"run `opro judge calibrate {config.source}` to measure it"
    try:
        report = load_calibration(config.output_dir)
    except DataError as exc:
        return f"judge noise: unknown ({exc})"
    if report is None:
        return f"judge noise: not measured for this judge; {hint}"
    if report.signature and report.signature != judge_signature(config):
        return f"judge noise: the stored calibration ({report.created}) is for other judge settings; {hint}"
    return f"judge noise ({report.method}): {report.summary()}"


__all__ = [
    "BASE_CONDITIONS",
    "CALIBRATION_DIR",
    "CALIBRATION_FILE",
    "CONDITIONS",
    "CalibrationItem",
    "CalibrationReport",
    "CalibrationVerdict",
    "ConditionStats",
    "ContrastStats",
    "RetestStats",
    "auc",
    "build_items",
    "calibrate_experiment",
    "calibration_record",
    "copy_judge_without_cache",
    "judge_noise_note",
    "judge_signature",
    "load_calibration",
    "plot_calibration",
    "run_judge",
    "summarize",
    "write_calibration",
]
