"""The objective is a type: a third objective is one class, and the search's parts that take an
objective (the sampler's study, the race, the finalist rule, the verdict) follow it unchanged."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import optuna
import pytest

from opro.config import OptimizerSection
from opro.errors import ConfigError
from opro.experiment.settings import validation_settings
from opro.program.cost import CostSummary
from opro.search import RacingPruner
from opro.search.finalists import choose_finalists
from opro.search.pruners import RunningCandidate
from opro.search.results import CandidateRecord
from opro.search.space import SearchSpace
from opro.search.trials import CandidateTrial
from opro.search.validation import validate
from opro.stats.claim import Claim
from opro.stats.objectives import COST, QUALITY, Direction, Race, Target, objective_named

#: The validation stage at the config's defaults (the settings types restate none).
DEFAULTS = validation_settings(OptimizerSection())


@dataclass(frozen=True)
class Latency:
    """A toy third objective: answer faster (seconds per answer), not worse by the margin; its race
    stops a candidate only when it cannot be within the margin of the initial configuration."""

    name: str = "latency"
    non_inferiority: bool = True
    directions: tuple[Direction, ...] = ("maximize", "minimize")

    def amount(self, cost: CostSummary | None) -> float | None:
        return None if cost is None else cost.seconds

    def values(self, score: float, cost: CostSummary | None) -> list[float] | None:
        return None if cost is None else [score, cost.seconds]

    def first_move(self, price: float) -> float:
        return price

    def prunes(self, race: Race, *, margin: float) -> bool:
        bound = race.against_initial()
        return bound is not None and bound < -margin

    def shift(self, margin: float) -> float:
        return margin

    def futility_confidence(self, alpha: float) -> float | None:
        return 1.0 - alpha

    def target(self, *, margin: float, gain: float) -> tuple[Target, float]:
        return "margin", margin

    def nothing_to_validate(self, *, margin: float) -> str:
        return f"no candidate answered faster without being clearly worse by more than {margin:g}"


LATENCY = Latency()


def _summary(*, seconds: float, cost: float) -> CostSummary:
    return CostSummary(n=6, prompt_tokens=cost, completion_tokens=0.0, seconds=seconds, cost=cost, unit="tokens")


def _record(name: str, scores: tuple[float, ...], index: int, *, seconds: float, cost: float,
            params: dict[str, Any] | None = None) -> CandidateRecord:
    return CandidateRecord(step=0 if index == 0 else 1, instruction=name, score=sum(scores) / len(scores),
                           n_scored=len(scores), n_invalid=0, n_errors=0, status="complete", trial_number=index,
                           index=index, scores=scores, params=params or {}, cost=_summary(seconds=seconds, cost=cost))


def test_the_objective_is_named_by_the_config_and_carried_by_the_claim() -> None:
    assert objective_named("quality") is QUALITY and objective_named("cost") is COST
    assert Claim(objective="cost") == Claim(objective=COST) and Claim().objective is QUALITY
    assert Claim(objective=LATENCY).futility_confidence == 0.95  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="objective must be one of 'quality', 'cost', got 'speed'"):
        objective_named("speed")


def test_the_sampler_optimizes_what_the_objective_says(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[optuna.Study] = []
    create = optuna.create_study

    def kept(**kwargs: Any) -> optuna.Study:
        made.append(create(**kwargs))
        return made[-1]

    monkeypatch.setattr(optuna, "create_study", kept)
    space = SearchSpace(dimensions={"top_k": [1, 2, 4]}, initial={"top_k": 2}, objective=LATENCY)  # type: ignore[arg-type]
    history = [_record("a", (3.0, 4.0), 0, seconds=2.0, cost=10.0, params={"top_k": 2}),
               _record("b", (4.0, 4.0), 1, seconds=0.5, cost=30.0, params={"top_k": 4})]
    assert len(space.sample(history, 2, step=1)) == 2
    (study,) = made
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    assert [t.values for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE] == [[3.5, 2.0], [4.0, 0.5]]


def _trial(scores: list[float]) -> CandidateTrial:
    mean = sum(scores) / len(scores)
    return CandidateTrial(
        number=0, state=optuna.trial.TrialState.COMPLETE, value=mean, intermediate_values={},
        instruction="initial", step=0, index=0, worker=0, claim=None, part=None, parts=0, part_scores=(),
        status="complete", score=mean, n_scored=len(scores), n_invalid=0, n_errors=0, scores=tuple(scores),
        cost=_summary(seconds=1.0, cost=100.0), costs=(100.0,) * len(scores))


def test_the_race_prunes_as_the_objective_says() -> None:
    initial = _trial([3.0] * 6)
    # Worse than the initial configuration so far (bound about -0.16): the quality race stops it, the
    # latency race lets it go on (within the margin of 0.25 it may still be), and stops a clear loser.
    unlucky = RunningCandidate({1: 2.25}, [2.0, 2.0, 2.0, 3.0], [100.0] * 4)
    assert RacingPruner(objective=QUALITY).decide(unlucky, [initial])
    race = RacingPruner(objective=LATENCY, margin=0.25)  # type: ignore[arg-type]
    assert not race.decide(unlucky, [initial])
    assert race.decide(RunningCandidate({1: 1.5}, [1.0, 2.0, 1.0, 2.0], [100.0] * 4), [initial])


def test_the_finalists_and_the_verdict_follow_the_objective() -> None:
    base = (3.0, 4.0, 3.0, 4.0, 3.0, 4.0)
    initial = _record("initial", base, 0, seconds=2.0, cost=100.0)
    # Faster but dearer, as good: a latency finalist; cheaper but slower: a cost finalist.
    faster = _record("faster", base, 1, seconds=1.0, cost=150.0, params={"top_k": 1})
    cheaper = _record("cheaper", base, 2, seconds=3.0, cost=50.0, params={"top_k": 8})
    history = [initial, faster, cheaper]

    def finalists(objective: Any) -> list[str]:
        settings = replace(DEFAULTS, claim=Claim(objective=objective, margin=0.25), finalists=2)
        return [r.instruction for r in choose_finalists(history, initial="initial", settings=settings, n_confirmation=40)]

    assert finalists(LATENCY) == ["faster"]
    assert finalists(COST) == ["cheaper"]
    assert finalists(QUALITY) == ["faster", "cheaper"]
    # Nothing faster: the stage returns before it asks a question (no study or scorer is touched).
    settings = replace(DEFAULTS, claim=Claim(objective=LATENCY, margin=0.25))  # type: ignore[arg-type]
    result = validate(study=None, scorer=None, settings=settings, validation_set=(),  # type: ignore[arg-type]
                      history=[initial, cheaper], initial="initial")
    assert result.verdict == "no candidate answered faster without being clearly worse by more than 0.25"
    assert result.summary()["objective"] == "latency" and result.margin == 0.25
