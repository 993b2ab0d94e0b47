"""How far two judges (or a judge and human labels) agree on the same answers.

Reference points: Databricks measured GPT-4 against human labels at over 80% exact agreement
and over 95% within one point; the Prometheus-vs-GPT-4 study reported Hamming distances of 58 and
41 over 100 YES/NO verdicts.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import ConfigError, DataError

if TYPE_CHECKING:
    from opro.evaluation.batch import Judge
    from opro.llm.pool import ModelSpec

LABELS = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class AgreementReport:
    """Agreement of two score lists over the pairs where both judges gave a valid score."""

    n: int
    n_dropped: int
    exact: float | None
    within_1: float | None
    kappa: float | None
    mean_a: float | None
    mean_b: float | None
    mean_difference: float | None
    distribution_a: dict[int, int]
    distribution_b: dict[int, int]

    def summary(self) -> str:
        def f(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        return (
            f"n={self.n} (dropped {self.n_dropped}), exact {f(self.exact)}, within-1 {f(self.within_1)}, "
            f"weighted kappa {f(self.kappa)}, mean difference (a-b) {f(self.mean_difference)}"
        )

    def rich_tables(
        self,
        *,
        name_a: str,
        name_b: str,
        scores: tuple[Sequence[float | None], Sequence[float | None]] | None = None,
    ) -> tuple[Any, Any]:
        """The statistics and the score distributions. With the two score lists, also the share of
        pairs on the same side of opro's pass mark (4), what a yes/no judge can agree on."""
        from rich.table import Table

        def f(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        stats = Table(title=f"judge agreement: A = {name_a}, B = {name_b}")
        stats.add_column("statistic")
        stats.add_column("value", justify="right")
        for label, value in [
            ("pairs scored by both", str(self.n)),
            ("pairs dropped (invalid / unlabelled)", str(self.n_dropped)),
            ("exact agreement", f(self.exact)),
            ("within 1 point", f(self.within_1)),
            ("quadratic weighted kappa", f(self.kappa)),
            ("mean A", f(self.mean_a)),
            ("mean B", f(self.mean_b)),
            ("mean difference A - B", f(self.mean_difference)),
        ]:
            stats.add_row(label, value)
        dist = Table(title="score distributions")
        dist.add_column("score", justify="right")
        dist.add_column("A", justify="right")
        dist.add_column("B", justify="right")
        for score in self.distribution_a:
            dist.add_row(str(score), str(self.distribution_a[score]), str(self.distribution_b[score]))
        if scores is not None:
            pairs = [(a >= 4.0, b >= 4.0) for a, b in zip(*scores, strict=True) if a is not None and b is not None]
            same = sum(x == y for x, y in pairs)
            stats.add_row("pass / fail agreement (score >= 4)", f"{same / len(pairs):.3f}" if pairs else "n/a")
        return stats, dist


def _category(score: float, labels: Sequence[int]) -> int:
    # Round half up (4.5 -> 5) and clamp onto the label scale: kappa needs categories.
    value = int(score + 0.5)
    return min(max(value, labels[0]), labels[-1])


def weighted_kappa(a: Sequence[int], b: Sequence[int], *, labels: Sequence[int] = LABELS) -> float | None:
    """Quadratically weighted Cohen's kappa; None when undefined (both raters constant and equal)."""
    if len(a) != len(b):
        raise DataError(f"weighted_kappa: score lists differ in length ({len(a)} vs {len(b)})")
    if not a:
        return None
    k = len(labels)
    index = {label: i for i, label in enumerate(labels)}
    observed = [[0.0] * k for _ in range(k)]
    for x, y in zip(a, b, strict=True):
        observed[index[x]][index[y]] += 1
    n = float(len(a))
    row = [sum(observed[i]) for i in range(k)]
    col = [sum(observed[i][j] for i in range(k)) for j in range(k)]
    num = den = 0.0
    for i in range(k):
        for j in range(k):
            w = (i - j) ** 2 / (k - 1) ** 2
            num += w * observed[i][j]
            den += w * row[i] * col[j] / n
    if den == 0.0:
        return None
    return 1.0 - num / den


def agreement(
    scores_a: Sequence[float | None], scores_b: Sequence[float | None], *, labels: Sequence[int] = LABELS
) -> AgreementReport:
    """Exact and within-1 agreement, quadratic weighted kappa, distributions and mean difference.

    Pairs where either score is None (an invalid judge reply) are dropped and counted. Scores are
    rounded to the nearest label for the categorical statistics; means use the raw values.
    """
    if len(scores_a) != len(scores_b):
        raise DataError(f"agreement: score lists differ in length ({len(scores_a)} vs {len(scores_b)})")
    pairs = [
        (float(x), float(y))
        for x, y in zip(scores_a, scores_b, strict=True)
        if x is not None and y is not None
    ]
    labels = sorted(labels)
    cat_a = [_category(x, labels) for x, _ in pairs]
    cat_b = [_category(y, labels) for _, y in pairs]
    n = len(pairs)
    dist_a = Counter(cat_a)
    dist_b = Counter(cat_b)
    return AgreementReport(
        n=n,
        n_dropped=len(scores_a) - n,
        exact=sum(x == y for x, y in zip(cat_a, cat_b, strict=True)) / n if n else None,
        within_1=sum(abs(x - y) <= 1 for x, y in zip(cat_a, cat_b, strict=True)) / n if n else None,
        kappa=weighted_kappa(cat_a, cat_b, labels=labels),
        mean_a=sum(x for x, _ in pairs) / n if n else None,
        mean_b=sum(y for _, y in pairs) / n if n else None,
        mean_difference=sum(x - y for x, y in pairs) / n if n else None,
        distribution_a={label: dist_a.get(label, 0) for label in labels},
        distribution_b={label: dist_b.get(label, 0) for label in labels},
    )


def hamming(a: Sequence[bool | None], b: Sequence[bool | None]) -> int:
    """Number of positions where two YES/NO verdict lists differ (a missing verdict counts as a difference)."""
    if len(a) != len(b):
        raise DataError(f"hamming: verdict lists differ in length ({len(a)} vs {len(b)})")
    return sum(1 for x, y in zip(a, b, strict=True) if x is None or y is None or bool(x) != bool(y))


# --- label / answer files --------------------------------------------------------------------------

_SCORE_FIELDS = ("score", "human_score", "label", "rating")


def _located_records(path: str | Path) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, row) of a CSV, JSON (a list, or an object with ``rows``/``examples``) or JSONL file;
    ``where`` names the file and the row or line, for messages."""
    from opro.data.dataset import read_records as located_records

    return located_records(path, list_keys=("rows", "examples"))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV, JSON (a list, or an object with ``rows``/``examples``) or JSONL file."""
    return [dict(r) for _, r in _located_records(path)]


def _to_score(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None  # "nan" parses, but is no score


def load_labels(path: str | Path) -> dict[str, float | None]:
    """Human (or other) labels by query from a CSV/JSON/JSONL file with ``query`` and a score field
    (``score``, ``human_score``, ``label`` or ``rating``). Blank or non-numeric scores load as None."""
    records, field = _label_records(path)
    return {str(r["query"]): _to_score(r.get(field)) for r in records}


def _label_records(path: str | Path) -> tuple[list[dict[str, Any]], str]:
    records = read_records(path)
    if not records:
        raise DataError(f"{path}: no label rows")
    field = next((f for f in _SCORE_FIELDS if f in records[0]), None)
    if "query" not in records[0] or field is None:
        raise DataError(
            f"{path}: label rows need a 'query' field and one of {_SCORE_FIELDS}; found {sorted(records[0])}"
        )
    return records, field


def match_labels(rows: Sequence[dict[str, Any]], path: str | Path) -> list[float | None]:
    """The label of every answer row, None where the file has none.

    Labels are matched by query, or by query *and* answer when the label file has an ``answer``
    column: a calibration's ``verdicts.csv`` judges several answers per question (reference, wrong,
    task), so the query alone would not say which answer a score belongs to.
    """
    records, field = _label_records(path)
    by_answer = "answer" in records[0]
    labels: dict[tuple[str, str | None], float | None] = {}
    for r in records:
        key = (str(r["query"]), str(r["answer"]) if by_answer else None)
        if key in labels and labels[key] != _to_score(r.get(field)):
            what = "query and answer" if by_answer else "query (add an 'answer' column to tell them apart)"
            raise DataError(f"{path}: two different scores for the same {what}: {key[0][:80]!r}")
        labels[key] = _to_score(r.get(field))
    return [labels.get((str(r["query"]), str(r["answer"]) if by_answer else None)) for r in rows]


def load_answers(path: str | Path) -> list[dict[str, Any]]:
    """Answer rows (``query``, ``answer``, ``reference`` or ``reference_answer``, optional ``score``)
    from an evaluation CSV/JSON written by :class:`opro.evaluation.batch.EvaluationReport`."""
    rows: list[dict[str, Any]] = []
    for where, r in _located_records(path):
        reference = r.get("reference", r.get("reference_answer"))
        if r.get("query") is None or r.get("answer") is None or reference is None:
            raise DataError(
                f"{where}: needs 'query', 'answer' and 'reference' (or 'reference_answer'); found {sorted(r)}"
            )
        if r.get("error"):
            continue  # a failed evaluation row has no answer to judge
        rows.append(
            {
                "query": str(r["query"]),
                "answer": str(r["answer"]),
                "reference": str(reference),
                "score": _to_score(r.get("score")),
            }
        )
    return rows


def parse_model_spec(text: str) -> ModelSpec:
    """A judge model from the command line.

    ``llamacpp:NAME_OR_GGUF``, ``openai:MODEL`` or ``openai:MODEL@BASE_URL`` (key from
    ``$OPENAI_API_KEY``), or a bare embedded model name / GGUF path (llama.cpp).
    """
    from opro.llm.packs import EMBEDDED_MODELS
    from opro.llm.pool import BACKENDS, ModelSpec

    backend, sep, rest = text.partition(":")
    if not sep or backend not in BACKENDS:
        backend, rest = "llamacpp", text
    if backend == "openai" and "@" in rest:
        model, _, base_url = rest.partition("@")
        return ModelSpec(backend="openai", model=model, base_url=base_url)
    if not rest:
        raise ConfigError(
            f"judge spec {text!r} names no model; use e.g. llamacpp:qwen2.5-coder-1.5b-instruct or openai:gpt-4o-mini"
        )
    if backend == "llamacpp" and rest not in EMBEDDED_MODELS and not Path(rest).expanduser().is_file():
        raise ConfigError(
            f"judge spec {text!r} is neither an embedded model ({', '.join(sorted(EMBEDDED_MODELS))}) nor a GGUF "
            "file; write llamacpp:NAME_OR_GGUF, openai:MODEL (key from $OPENAI_API_KEY) or openai:MODEL@BASE_URL"
        )
    return ModelSpec(backend=backend, model=rest)  # type: ignore[arg-type]


def judge_scores(
    judge: Judge, rows: Sequence[dict[str, Any]], *, progress: bool = True
) -> list[float | None]:
    """The judge's score of every answer row (None for an invalid reply)."""
    from opro.progress import progress_bar

    scores: list[float | None] = []
    with progress_bar("judging", total=len(rows), enabled=progress) as bar:
        for r in rows:
            scores.append(
                judge.measure(query=r["query"], answer=r["answer"], reference=r["reference"]).score
            )
            bar.advance()
    return scores


__all__ = [
    "LABELS",
    "AgreementReport",
    "agreement",
    "hamming",
    "judge_scores",
    "load_answers",
    "load_labels",
    "match_labels",
    "parse_model_spec",
    "read_records",
    "weighted_kappa",
]


@dataclass(frozen=True)
class JudgeAgreement:
    """Two judges' (or a judge's and the labels') scores of the same answers, and how far they agree."""

    report: AgreementReport
    name_a: str
    name_b: str
    scores_a: tuple[float | None, ...]
    scores_b: tuple[float | None, ...]
    #: A yes/no judge (``mlflow:``) took part: what can agree is the verdict at opro's pass mark (4).
    verdicts: bool

    def rich_tables(self) -> tuple[Any, Any]:
        return self.report.rich_tables(name_a=self.name_a, name_b=self.name_b,
                                       scores=(list(self.scores_a), list(self.scores_b)) if self.verdicts else None)


def spec_scores(models: Any, spec: str, rows: Sequence[dict[str, Any]], *, template: str,
                score_from: str) -> list[float | None]:
    """The scores of the judge ``spec`` (``llamacpp:NAME``, ``openai:MODEL[@BASE_URL]``; ``mlflow:`` before
    it: MLflow's built-in correctness judge on that model) on ``rows``, its client made by ``models``
    (a :class:`~opro.llm.factory.ClientFactory`); the [judge] defaults apart from ``template`` and
    ``score_from`` (the template path read as given)."""
    from opro.config import JudgeSection, check_score_from
    from opro.judges import build_judge

    check_score_from(score_from, where="--score-from-a/-b")
    mlflow_judge = spec.startswith("mlflow:")
    try:
        model = parse_model_spec(spec.removeprefix("mlflow:"))
    except ConfigError as exc:  # name the spec as it was given
        raise ConfigError(f"{exc} (after mlflow:)" if mlflow_judge else str(exc)) from None
    client = models.client(model, role="judge")
    if mlflow_judge:
        from opro.tracking import scorers

        return judge_scores(scorers.mlflow_correctness_judge(client), rows)
    section = JudgeSection(template=template, score_from=score_from)  # type: ignore[arg-type]
    return judge_scores(build_judge(section=section, client=client), rows)


def judge_agreement(
    answers: str | Path,
    *,
    judge_a: str | None = None,
    judge_b: str | None = None,
    labels: str | Path | None = None,
    template: str = "llamaindex",
    template_b: str | None = None,
    score_from_a: str = "reply",
    score_from_b: str = "reply",
    cache: str | None = None,
    use_cache: bool = True,
) -> JudgeAgreement:
    """Judge A (``judge_a``, or the answers file's ``score`` column) against judge B (``judge_b``) or
    the ``labels`` file (exactly one of them), on the answers of ``answers``."""
    from opro.errors import OproError
    from opro.llm.factory import ClientFactory, open_cache

    rows = load_answers(answers)
    with ClientFactory(cache=open_cache(cache, enabled=use_cache)) as models:
        if judge_a is None:
            if all(r["score"] is None for r in rows):
                raise OproError(f"{answers} has no 'score' column to use as judge A; pass --judge-a SPEC")
            scores_a, name_a = [r["score"] for r in rows], "file scores"
        else:
            scores_a, name_a = spec_scores(models, judge_a, rows, template=template, score_from=score_from_a), judge_a
        if labels is not None:
            scores_b = match_labels(rows, labels)
            if all(x is None for x in scores_b):
                raise OproError(
                    f"no answer of {answers} has a label in {labels}; labels are matched by exact query text "
                    "(and answer text when the label file has an 'answer' column)"
                )
            name_b = "labels"
        else:
            if judge_b is None:
                raise ConfigError("give exactly one of --judge-b SPEC or --labels FILE")
            scores_b = spec_scores(models, judge_b, rows, template=template_b or template, score_from=score_from_b)
            name_b = judge_b
    verdicts = any(s is not None and s.startswith("mlflow:") for s in (judge_a, judge_b))
    return JudgeAgreement(report=agreement(scores_a, scores_b), name_a=name_a, name_b=name_b,
                          scores_a=tuple(scores_a), scores_b=tuple(scores_b), verdicts=verdicts)
