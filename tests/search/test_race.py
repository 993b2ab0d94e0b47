"""The race knows the objective (issue 57, item 1): with ``objective = "cost"`` a candidate is stopped only
when it cannot be what the cost objective looks for; with ``"quality"`` the race is what it was."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import experiment_config

from opro.config import OptimizerSection, config_from_dict
from opro.experiment import Experiment, RunResult
from opro.experiment.settings import pruner_settings
from opro.program.cost import CostSummary
from opro.search import RacingPruner, make_pruner
from opro.search.pruners import RunningCandidate
from opro.search.trials import CandidateTrial

INITIAL = "Answer the question."


def _complete(step: int, index: int, scores: list[float], cost: float) -> CandidateTrial:
    import optuna

    return CandidateTrial(
        number=index, state=optuna.trial.TrialState.COMPLETE, value=sum(scores) / len(scores),
        intermediate_values={}, instruction=f"candidate {step}.{index}", step=step, index=index, worker=0,
        claim=None, part=None, parts=0, part_scores=(), status="complete", score=sum(scores) / len(scores),
        n_scored=len(scores), n_invalid=0, n_errors=0, scores=tuple(scores),
        cost=CostSummary(n=len(scores), prompt_tokens=cost, completion_tokens=0, seconds=1.0, cost=cost, unit="tokens"),
        costs=(cost,) * len(scores))


def _running(scores: list[float], cost: float) -> RunningCandidate:
    return RunningCandidate({len(scores) // 2 - 1: sum(scores) / len(scores)}, scores, [cost] * len(scores))


# The initial configuration, 3.0 on each of six questions; a cheaper candidate whose first four
# questions came out worse by chance: -0.75 on average, a one-sided 95% upper bound of about -0.16.
INITIAL_TRIAL = _complete(0, 0, [3.0, 3.0, 3.0, 3.0, 3.0, 3.0], cost=100.0)
UNLUCKY = [2.0, 2.0, 2.0, 3.0]


def test_quality_race_stops_a_candidate_confidently_worse_than_the_incumbent() -> None:
    race = RacingPruner()
    assert race.upper_bound([-1.0, -1.0, -1.0, 0.0]) == pytest.approx(-0.162, abs=1e-3)
    assert race.decide(_running(UNLUCKY, cost=50.0), [INITIAL_TRIAL])
    assert make_pruner(pruner_settings(OptimizerSection())).objective.name == "quality"  # type: ignore[attr-defined]


def test_cost_race_lets_a_cheaper_candidate_whose_bound_is_above_minus_margin_go_on() -> None:
    race = make_pruner(pruner_settings(OptimizerSection(objective="cost", margin=0.25)))
    assert isinstance(race, RacingPruner) and (race.objective.name, race.margin) == ("cost", 0.25)
    # Worse than the initial configuration so far, but its bound (-0.16) is above -0.25: it may still
    # be within the margin, so it goes on (today's race stopped it: its bound is below 0).
    assert not race.decide(_running(UNLUCKY, cost=50.0), [INITIAL_TRIAL])
    # Confidently more than the margin worse: it cannot be what the objective looks for.
    assert race.decide(_running([1.0, 2.0, 1.0, 2.0], cost=50.0), [INITIAL_TRIAL])
    # Better than the best complete candidate of an earlier step matters no more than being worse:
    best = _complete(1, 0, [5.0] * 6, cost=120.0)
    assert not race.decide(_running(UNLUCKY, cost=50.0), [INITIAL_TRIAL, best])


def test_cost_race_stops_a_dominated_candidate_and_only_that() -> None:
    race = RacingPruner(objective="cost", margin=0.25)
    cheap_and_good = _complete(1, 0, [4.0] * 6, cost=40.0)
    earlier = [INITIAL_TRIAL, cheap_and_good]
    # No cheaper than a complete candidate that is confidently better: dominated, never on the front.
    assert race.decide(_running([3.0, 3.0, 3.0, 3.0], cost=60.0), earlier)
    # As bad, but cheaper than it: not dominated by it (and within the margin of the initial one).
    assert not race.decide(_running([3.0, 3.0, 3.0, 3.0], cost=30.0), earlier)
    # Dearer, but not confidently worse: not dominated.
    assert not race.decide(_running([4.0, 4.0, 3.0, 5.0], cost=60.0), earlier)
    # Without per-question costs (a trial from before they were kept) the means compare.
    old = _running([3.0, 3.0, 3.0, 3.0], cost=60.0)
    assert race.decide(old, [INITIAL_TRIAL, CandidateTrial(**{**cheap_and_good.__dict__, "costs": ()})])


# -- the whole search, scripted: the unlucky cheap candidate reaches validation -----------------------
LONG = "Using the context, the answer is yes, as the passage plainly says."


def _unlucky_world(tmp_path: Path, *, pruner: str = "race", wrong: bool = False) -> RunResult:
    """"briefly" makes the answer one word instead of twelve. The judge scores every question the same
    under either, except that the one-word answer scores a point lower on the first three optimization
    questions and a point higher on the last two: worse after four questions (-0.75), -0.17 after six.
    With ``wrong`` a second candidate ("wrongly": "No.") scores 1 everywhere."""
    from fault_server import instruction_of

    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    order: dict[str, int] = {}

    def task(messages: tuple, options: object) -> str:
        instruction = instruction_of(messages[-1].content).lower()
        return "No." if "wrongly" in instruction else "Yes." if "briefly" in instruction else LONG

    def judge(messages: tuple, options: object) -> str:
        text = messages[-1].content
        number = int(m.group(1)) if (m := re.search(r"Fact number (\d+)", text)) else 0
        position = order.get(f"Fact number {number} about AlexNet?", -1)
        score = 3 + number % 2
        if "## Generated Answer\nNo.\n" in text:
            score = 1
        elif LONG not in text:
            score += {0: -1, 1: -1, 2: -1, 4: 1, 5: 1}.get(position, 0)
        return json.dumps({"score": score, "reasoning": "scripted"})

    def optimizer(messages: tuple, options: object) -> str:
        i = (getattr(options, "seed", 0) or 0) % 1000
        return f"<INS>Answer {'wrongly' if i % 2 else 'briefly'}, variant {i}.</INS>"

    pool = ModelPool(scripted={"task": ScriptedLLM(default=task, model="task"),
                               "judge": ScriptedLLM(default=judge, model="judge"),
                               "optimizer": ScriptedLLM(default=optimizer, model="optimizer")})
    cfg = experiment_config(
        tmp_path, questions=30,
        data={"split": {"exemplar": 2, "optimization": 6, "validation": 16, "heldout": 4, "seed": 1}},
        optimizer={"steps": 1, "candidates_per_step": 2 if wrong else 1, "minibatch_size": 2, "objective": "cost", "margin": 0.25,
                   "pruner": pruner, "lookahead": False})
    exp = Experiment(config_from_dict(cfg, base_dir=tmp_path, source="test.toml"), pool=pool, progress=False)
    try:
        order.update({e.query: i for i, e in enumerate(exp.dataset.examples_in("optimization"))})
        return exp.optimize()
    finally:
        exp.close()


def test_a_cheaper_candidate_that_looks_worse_early_is_not_pruned_and_reaches_validation(tmp_path: Path) -> None:
    result = _unlucky_world(tmp_path)
    initial = next(r for r in result.history if r.name == INITIAL)
    cheap = [r for r in result.history if "briefly" in r.instruction]
    assert len(cheap) == 1 and cheap[0].status == "complete"
    # The unlucky start: after four questions -0.75 (today's race stopped it there), after six -0.17.
    assert [a - b for a, b in zip(cheap[0].scores, initial.scores, strict=True)] == [-1, -1, -1, 0, 1, 1]
    v = result.validation
    assert v is not None and [f.instruction for f in v.finalists] == [cheap[0].name]
    assert v.n_questions > 0


def test_pareto_and_the_candidates_table_show_every_candidate_the_pruned_ones_marked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    import opro.tracking.plots
    from opro.cli.render import _candidates_table

    drawn: list[dict] = []
    real = opro.tracking.plots.plot_pareto

    def spy(points: list, **kw: object) -> Path:
        drawn.append({"points": list(points), **kw})
        return real(points, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(opro.tracking.plots, "plot_pareto", spy)
    result = _unlucky_world(tmp_path, wrong=True)
    wrong = next(r for r in result.history if "wrongly" in r.instruction)
    assert wrong.status == "pruned" and len(wrong.scores) == 4  # confidently more than 0.25 worse
    # pareto.png: every candidate, the pruned one at its running mean and marked; the measure named.
    (call,) = drawn
    assert [p.label for p in call["points"]] == [r.name for r in result.history]
    assert [p.pruned for p in call["points"]] == [r.status == "pruned" for r in result.history]
    assert call["cost_label"] == "weighted task tokens (prompt + 4 x completion)"
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 1000
    # The results table lists every candidate too, the pruned one marked, at 80 columns.
    console = Console(file=io.StringIO(), width=80, record=True)
    for part in _candidates_table(result, measure=call["cost_label"]):
        console.print(part)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "pruned after 4 q" in text and "cost: weighted task tokens (prompt + 4 x completion)" in text
    assert text.count("\nc") >= len(result.history) and wrong.name in " ".join(text.split())
