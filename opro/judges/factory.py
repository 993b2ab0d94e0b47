"""Where judges are built: the correctness judge from a ``[judge]`` table, the other pointwise
judges (faithfulness, relevancy) by name.

Every part of opro that needs an LLM judge (an experiment, ``opro judge agreement``, the extra
metrics of ``opro evaluate`` / ``opro compare``: :func:`make_extra_metrics`) builds it here, so the
settings a judge is built with are decided in one place. A new kind of pointwise judge is one module in :mod:`opro.judges`
and one entry in :data:`METRIC_JUDGES`; ``tests/judges/test_judges_contract.py`` then runs the judge
contract over it (and fails if a judge is built anywhere else in opro).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from opro.errors import ConfigError
from opro.judges.correctness import CorrectnessJudge, ScoreFrom
from opro.judges.metrics import Metric, TokenF1
from opro.judges.mlflow_correctness import CorrectnessPrompt, MlflowCorrectnessJudge
from opro.judges.sidebyside import PairedMode, SideBySideJudge
from opro.judges.yesno import FaithfulnessJudge, RelevancyJudge
from opro.llm import ChatClient

#: A ``[judge].template`` with one of these endings is a template file, not a built-in name.
TEMPLATE_FILE_SUFFIXES: tuple[str, ...] = (".toml", ".txt", ".md")

#: The pointwise judges built by name (``--metrics faithfulness,relevancy``), each from the judge
#: model's client with its own defaults. Read-only: a new kind is registered here, in the source.
METRIC_JUDGES: Mapping[str, Callable[[ChatClient], Metric]] = MappingProxyType(
    {judge.name: judge for judge in (FaithfulnessJudge, RelevancyJudge)}
)


class JudgeTable(Protocol):
    """What a judge is built from: a ``[judge]`` table (:class:`opro.config.JudgeSection`; the config sits
    above the judges, so they read its fields, not its type)."""

    @property
    def template(self) -> str: ...
    @property
    def threshold(self) -> float: ...
    @property
    def structured(self) -> bool: ...
    @property
    def expected_score(self) -> bool: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def score_from(self) -> ScoreFrom: ...
    @property
    def paired(self) -> PairedMode: ...
    @property
    def both_orders(self) -> bool: ...


def judge_template(*, section: JudgeTable, resolve: Callable[[str], Path] | None = None) -> str | Path:
    """``[judge].template`` as :class:`CorrectnessJudge` takes it: a built-in template's name, or a file.

    A value ending in .toml / .txt / .md is a file, placed by ``resolve`` (an experiment resolves it
    against its config's folder); without ``resolve`` it is used as written (relative to the working
    directory, as a command-line option is).
    """
    template = section.template
    if resolve is not None and template.endswith(TEMPLATE_FILE_SUFFIXES):
        return resolve(template)
    return template


def build_judge(
    *, section: JudgeTable, client: ChatClient, resolve: Callable[[str], Path] | None = None
) -> CorrectnessJudge:
    """The correctness judge a ``[judge]`` table describes, on ``client`` (the judge model).

    ``resolve`` places a template file (see :func:`judge_template`). The settings the table does not
    hold (reasoning order, temperature, the logit judge's minimum score mass) keep the judge's defaults.
    Raises :class:`~opro.errors.ConfigError` for a template that is neither built in nor a readable
    file, and for ``score_from = 'logits'`` on a backend that cannot read logits.
    """
    return CorrectnessJudge(
        client,
        template=judge_template(section=section, resolve=resolve),
        threshold=section.threshold,
        structured=section.structured,
        expected_score=section.expected_score,
        max_tokens=section.max_tokens,
        score_from=section.score_from,
    )


def build_paired_judge(*, section: JudgeTable, client: ChatClient, seed: int) -> SideBySideJudge | None:
    """The side-by-side judge of a paired decision when ``[judge].paired = "side_by_side"`` (None for
    ``pointwise``), on ``client`` (the judge model); ``seed`` (the run's) draws each question's order.
    It reads its scores as the pointwise judge does (``score_from``) within the table's ``max_tokens``."""
    if section.paired != "side_by_side":
        return None
    return SideBySideJudge(
        client,
        seed=seed,
        both_orders=section.both_orders,
        structured=section.structured,
        max_tokens=max(section.max_tokens, 16),
        score_from=section.score_from,
    )


def build_metric(name: str, *, client: ChatClient) -> Metric:
    """The pointwise judge registered as ``name`` in :data:`METRIC_JUDGES`, on ``client``."""
    try:
        make = METRIC_JUDGES[name]
    except KeyError:
        raise ConfigError(f"unknown judge metric {name!r}; choose from {', '.join(METRIC_JUDGES)}") from None
    return make(client)


def build_mlflow_correctness(client: ChatClient, *, prompt: CorrectnessPrompt) -> MlflowCorrectnessJudge:
    """MLflow's correctness judge on ``client``, asking with ``prompt`` (MLflow's own prompt writer,
    which :func:`opro.tracking.scorers.mlflow_correctness_judge` passes: only tracking imports MLflow)."""
    return MlflowCorrectnessJudge(client, prompt=prompt)


#: The metrics against the reference answer built by name (no model): each under its own ``name``.
REFERENCE_METRICS: Mapping[str, Callable[[], Metric]] = MappingProxyType({TokenF1.name: TokenF1})

#: The extra metrics ``opro evaluate`` / ``opro compare`` take by name (``--metrics``): the judges of
#: :data:`METRIC_JUDGES`, and those of :data:`REFERENCE_METRICS` (token F1).
EXTRA_METRICS: tuple[str, ...] = (*METRIC_JUDGES, *REFERENCE_METRICS)


def make_extra_metrics(names: Sequence[str], *, judge_client: Callable[[], ChatClient]) -> list[Metric]:
    """The metrics ``names`` (from :data:`EXTRA_METRICS`, any case, ``-`` for ``_``; blanks skipped):
    the judges of :data:`METRIC_JUDGES` on the judge model's client (``judge_client()``, asked for only
    when a judge is named), and ``token_f1``."""
    metrics: list[Metric] = []
    for raw in names:
        name = raw.strip().lower().replace("-", "_")
        if not name:
            continue
        if name in METRIC_JUDGES:
            metrics.append(build_metric(name, client=judge_client()))
        elif name in REFERENCE_METRICS:
            metrics.append(REFERENCE_METRICS[name]())
        else:
            raise ConfigError(f"unknown extra metric {raw!r}; choose from {', '.join(EXTRA_METRICS)}")
    return metrics


__all__ = [
    "EXTRA_METRICS",
    "METRIC_JUDGES",
    "REFERENCE_METRICS",
    "TEMPLATE_FILE_SUFFIXES",
    "JudgeTable",
    "build_judge",
    "build_metric",
    "build_mlflow_correctness",
    "build_paired_judge",
    "judge_template",
    "make_extra_metrics",
]
