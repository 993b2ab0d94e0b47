"""How honest is the returned prompt? The old selection rule against the validated one.

(a) Simulation (scripted models, no LLM; a couple of minutes). Each seed draws true effects for the
candidates the optimizer proposes (most are no better than the initial instruction, some worse, a
few better), and a judge scores 1-5 with a per-question level plus per-call noise, sized like the
embedded 1.5B judge on 0.5B RAG answers (docs/benchmarks.md's calibration: scores spread over 1-4, sd about 1.2).
The real ``opro.search.Search`` runs the search and the selection, twice per seed:
  * old rule: the search's arg-max is returned and its in-sample mean reported (finalists = 0,
    the old ``best`` pruner);
  * new rule: the top finalists and the initial instruction are re-scored on validation questions
    and a finalist is returned only if it beats the initial one by a paired, Holm-corrected test.
Reported: the bias of the reported score (reported minus the returned prompt's true mean), the
probability of returning a prompt truly worse than the initial one by >= 0.25, and how often a truly
better prompt (>= +0.5) that the search proposed is returned.

(b) A real run: ``--run-dir runs/history_of_alexnet`` reads that run's ``summary.json`` and its latest
``opro compare`` report and prints the winner's search, validation and held-out scores.

(c) ``--power``: fixed true effects, the validated search run whole; ``--world realistic`` swaps the
judge for a harsher one: bimodal scores (half the questions hard, half easy: mostly 1-2 or 4-5), a
share of questions on which every prompt gives the same answer (so the same score: ties from
identical answers), and per-question effects of mixed sign around the prompt's effect (a better
prompt still loses some questions; an equal one wins some and loses others).

(e) ``--coverage``: the validation stage alone, at fixed true gains, as many runs as it takes to
collect ``--claims`` claims (rare ones included): how often the claimed gain's conditional interval
(``opro.stats.sequential.conditional_estimate``) covers the true gain, in either world. The real
sign-flip test decides; runs whose studentized sum never reaches ``SCREEN`` before they stop cannot
claim and are not sent through it (checked on a sample of them, printed).

    python experiments/bench_selection.py --seeds 200
    python experiments/bench_selection.py --power --seeds 200 --optimization 6 --validation 48 --unused 20
    python experiments/bench_selection.py --power --world realistic --seeds 200 --optimization 6 --validation 48 --unused 20
    python experiments/bench_selection.py --coverage --world realistic --claims 200
    python experiments/bench_selection.py --run-dir runs/history_of_alexnet
    python experiments/bench_selection.py --cost --seeds 200 --optimization 6 --validation 48 --unused 20
    python experiments/bench_selection.py --cost --space --seeds 200 --optimization 6 --validation 48 --unused 20

(g) ``--errors``: the validation stage's test alone (experiments/validation_errors.py), in every world
of bench_compare_tests (integer 1-5 scores with ties: ``rounded``, ``realistic``; continuous at paired
sd 0.66: ``measured``; heavy tails: ``t3``; rare large losses, ``skewed``, or gains, ``skewed-gains``;
mostly identical scores with 2-3 point losses on a share, ``tied``; clusters of 2-6 questions sharing a
source passage, ``clustered``, where the betting test also runs on the clusters' means): the error rate of the gain test
and of non-inferiority at the margin, and their power, the test before (flipping Hall's statistic)
beside the betting test opro runs, on the same runs. ``--world`` keeps one world.

    python experiments/bench_selection.py --errors --runs 2000 --today-runs 500
    python experiments/bench_selection.py --cost --world skewed --seeds 200 --optimization 6 --validation 48 --unused 20

(d) ``--cost``: ``[optimizer].objective = "cost"`` (margin 0.25). Every proposal's answers are 30%
shorter than the initial instruction's (its cost per answer about 30% lower), and
its quality is either truly equal or truly worse by the margin (mean judge score, after rounding).
Reported: how often the cheaper configuration is returned with a non-inferiority claim (the issue's
aims: >= 0.8 where equal, <= alpha over all looks where worse by the margin), and the saving claimed.

(f) ``--cost --space``: a settings space (9 settings) with one truly equal, about 35% cheaper setting
among settings truly worse by 0.5, per-question effects and the measured judge; today's search (the
quality race, the sampler alone) beside this one (the objective-aware race, step 0's first moves). See
``experiments/bench_cost_space.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from bench_world import INITIAL, EchoProgram, ReplyJudge, _normal, _uniform

from opro.config import OptimizerSection
from opro.errors import ConfigError
from opro.experiment.settings import proposer_settings, pruner_settings, search_settings, validation_settings
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.llm import ChatClient, GenerationOptions, Message, UsageLedger
from opro.llm.scripted import ScriptedLLM
from opro.search import CandidateScorer, Search, SearchStudy, make_proposer, make_pruner, open_storage
from opro.testing.score_worlds import (
    EASY_LEVEL,
    FAIL_LOSS,
    FAIL_SHARE,
    HARD_LEVEL,
    HARD_SHARE,
    IDENTICAL_SHARE,
    LEVEL_SD,
    MEASURED_LEVEL,
    MEASURED_LEVEL_SD,
    MEASURED_SDS,
    MEASURED_TIES,
    REAL_NOISE_SD,
    SKEW_LEVEL,
    SKEW_NOISE,
    SPREAD,
    measured_pairs,
    noise_for,
    solve,
)
from opro.testing.score_worlds import effect_for as world_effect_for
from opro.testing.worlds import Ex, TextTemplate  # the tests' keyword world shares them

BASE_LEVEL = 3.0
QUESTION_SD = 0.6  # how much questions differ in difficulty (shared by every prompt: the pairing)
NOISE_SD = 0.9  # per-call judge noise; with QUESTION_SD the spread of a prompt's scores is about 1.1


def _score(level: float) -> float:
    return float(min(5, max(1, round(level))))


Kind = Literal["rounded", "realistic", "measured", "t3", "skewed"]

#: ``--world measured`` (the cost worlds, (d)): the judge as measured on the embedded stack, not assumed
#: (bench_compare_tests.MEASURED_SDS says where its numbers come from).


def true_mean(effect: float, n: int = 200_000, *, world: Kind = "rounded", initial: bool = False) -> float:
    """Expected judge score of a prompt with this effect, over questions and noise (Monte Carlo). In
    the realistic world every prompt but the initial one (``initial``) also has its per-question
    effects of mixed sign, which on a clipped scale move the mean too."""
    rng = np.random.default_rng(12345)
    if world == "rounded":
        x = BASE_LEVEL + effect + rng.normal(0, QUESTION_SD, n) + rng.normal(0, NOISE_SD, n)
        return float(np.clip(np.round(x), 1, 5).mean())
    level = np.where(rng.random(n) < HARD_SHARE, HARD_LEVEL, EASY_LEVEL) + rng.normal(0, LEVEL_SD, n)
    same = rng.random(n) < IDENTICAL_SHARE
    shift = 0.0 if initial else effect / (1 - IDENTICAL_SHARE) + SPREAD * rng.normal(size=n)
    noise = rng.normal(0, REAL_NOISE_SD, n)
    return float(np.clip(np.round(level + np.where(same, 0.0, shift) + noise), 1, 5).mean())


class World:
    """One seed's truth: the effect of every instruction the optimizer can propose."""

    def __init__(self, seed: int, *, better_by: float | None = None, kind: Kind = "rounded") -> None:
        self.seed = seed
        #: None: the mixture below; a number: about 1 proposal in 6 is better by it, the rest equal.
        self.better_by = better_by
        self.kind = kind

    def effect(self, instruction: str) -> float:
        if instruction.startswith(INITIAL):
            return 0.0
        if self.better_by is not None:
            return self.better_by if _normal(self.seed, "better", instruction) > 1.0 else 0.0
        z = _normal(self.seed, "effect", instruction)
        # Most proposals are no better than the initial instruction; about 1 in 6 is 0.5+ better.
        return round(-0.15 + 0.45 * z, 2)

    def judge(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        text = messages[-1].content
        answer = text.split("Answer: ", 1)[1].split("\nReference:")[0]
        question = text.split("Question: ", 1)[1].split("\n")[0]
        if self.kind == "realistic":
            return str(self._realistic(question, answer))
        level = BASE_LEVEL + QUESTION_SD * _normal(self.seed, "q", question)
        noise = NOISE_SD * _normal(self.seed, "n", question, answer)
        return str(_score(level + self.effect(answer) + noise))

    def _realistic(self, question: str, answer: str) -> float:
        hard = _uniform(self.seed, "hard", question) < HARD_SHARE
        level = (HARD_LEVEL if hard else EASY_LEVEL) + LEVEL_SD * _normal(self.seed, "q", question)
        if _uniform(self.seed, "same", question) < IDENTICAL_SHARE or answer.startswith(INITIAL):
            # Every prompt answers this question alike (or this is the initial one): no effect, and
            # the judge's noise is the initial answer's, so identical answers score identically.
            return _score(level + REAL_NOISE_SD * _normal(self.seed, "n", question, INITIAL))
        shift = self.effect(answer) / (1 - IDENTICAL_SHARE) + SPREAD * _normal(self.seed, "spread", question, answer)
        return _score(level + shift + REAL_NOISE_SD * _normal(self.seed, "n", question, answer))

    def propose(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return f"<INS>Candidate {options.seed} of world {self.seed}.</INS>"


#: ``--cost``: filler words of the initial instruction's answers and of a proposal's, so that a
#: proposal's cost per answer (prompt + 4 x completion tokens, its instruction included) is about 30%
#: lower (measured and printed: the claimed saving).
LONG_ANSWER = 40
SHORT_ANSWER = 24


def _padded(instruction: str) -> str:
    """The cost world's answer: the instruction (what the judge reads the effect from), then filler."""
    return instruction + " word" * (LONG_ANSWER if instruction.startswith(INITIAL) else SHORT_ANSWER)


class CheaperWorld(World):
    """Every proposal is cheaper (shorter answers) and shifted in quality by ``effect``; ``kind``
    ``measured`` scores as :func:`measured_pairs` does, with per-answer noise ``noise_sd``."""

    def __init__(self, seed: int, *, effect: float, kind: Kind = "rounded", noise_sd: float = 0.0) -> None:
        super().__init__(seed, kind=kind)
        self.shift = effect
        self.noise_sd = noise_sd

    def effect(self, instruction: str) -> float:
        return 0.0 if instruction.startswith(INITIAL) else self.shift

    def _noise(self, *parts: object) -> float:
        """Judge noise of an answer: normal, or Student t(3) in the ``t3`` world (heavy tails)."""
        z = _normal(self.seed, "n", *parts)
        if self.kind == "t3":
            z /= math.sqrt(sum(_normal(self.seed, "chi", i, *parts) ** 2 for i in range(3)) / 3)
        return self.noise_sd * z

    def _skewed(self, question: str, answer: str) -> str:
        """The skewed world (bench_compare_tests.skewed_pairs): a cheaper answer fails (FAIL_LOSS points lower)
        on FAIL_SHARE of the questions and moves by the rest of the effect elsewhere."""
        level = SKEW_LEVEL[0] + (SKEW_LEVEL[1] - SKEW_LEVEL[0]) * _uniform(self.seed, "level", question)
        noise = SKEW_NOISE / math.sqrt(2) * _normal(self.seed, "n", question, answer)
        if not answer.startswith(INITIAL):
            fail = _uniform(self.seed, "fail", question) < FAIL_SHARE
            level += -FAIL_LOSS if fail else (self.shift + FAIL_SHARE * FAIL_LOSS) / (1 - FAIL_SHARE)
        return f"{min(5.0, max(1.0, level + noise)):.4f}"

    def judge(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        if self.kind not in ("measured", "t3", "skewed"):
            return super().judge(messages, options)
        text = messages[-1].content
        answer = text.split("Answer: ", 1)[1].split("\nReference:")[0]
        question = text.split("Question: ", 1)[1].split("\n")[0]
        if self.kind == "skewed":
            return self._skewed(question, answer)
        level = MEASURED_LEVEL + MEASURED_LEVEL_SD * _normal(self.seed, "q", question)
        if _uniform(self.seed, "same", question) < MEASURED_TIES or answer.startswith(INITIAL):
            # A tie: the same verdict as the initial answer's (which this is, or is judged alike).
            return f"{min(5.0, max(1.0, level + self._noise(question, INITIAL))):.4f}"
        return f"{min(5.0, max(1.0, level + self.effect(answer) + self._noise(question, answer))):.4f}"


def run_once(world: World, *, rule: str, n_opt: int, n_val: int, steps: int, k: int, folder: Path,
             design: dict[str, Any] | None = None, n_unused: int = 0) -> dict[str, Any]:
    usage = UsageLedger()
    if rule == "old":
        settings = OptimizerSection(steps=steps, candidates_per_step=k, minibatch_size=2, pruner="best",
                                    prune_margin=1.0, finalists=0)
    else:
        settings = OptimizerSection(**{"steps": steps, "candidates_per_step": k, "minibatch_size": 2,
                                       "pruner": "race", **(design or {})})
    pad = _padded if isinstance(world, CheaperWorld) else (lambda text: text)
    program = EchoProgram(ChatClient(ScriptedLLM(default=lambda m, o: pad(m[-1].content.split("\nQuery:")[0])),
                                     role="task", usage=usage))
    study = SearchStudy.open(open_storage(f"sqlite:///{folder / f'{rule}-{world.seed}.db'}"), name="bench",
                             pruner=make_pruner(pruner_settings(settings)))
    search = Search(
        make_proposer(settings=proposer_settings(settings), seed=world.seed, template_text=TextTemplate("<INS>").template_text,
                      llm=ChatClient(ScriptedLLM(default=world.propose), role="optimizer", usage=usage, seed=world.seed)),
        CandidateScorer(program=program, template=TextTemplate(""),
                        judge=ReplyJudge(ChatClient(ScriptedLLM(default=world.judge), role="judge", usage=usage))),
        study, search_settings(settings), usage=usage, seed=world.seed, progress=False,
    )
    result = search.run(
        optimization_set=[Ex(f"opt {world.seed}-{i}?", "r") for i in range(n_opt)],
        validation_set=[Ex(f"val {world.seed}-{i}?", "r") for i in range(n_val)] if rule == "new" else [],
        extension_set=[Ex(f"unused {world.seed}-{i}?", "r") for i in range(n_unused)] if rule == "new" else [],
        exemplar_set=[Ex("exemplar?", "r")],
        initial=[INITIAL],
    )
    effects = [world.effect(r.instruction) for r in result.history]
    return {
        "reported": result.best_score,
        "returned_effect": world.effect(result.best_instruction),
        "best_proposed_effect": max(effects),
        "claims_gain": result.validated if rule == "new" else result.best_instruction != INITIAL,
        "reported_gain": result.gain,
        "gain_ci": result.gain_ci,
        "raw_gain": result.validation.winner.difference_raw if result.validation and result.validation.winner else None,
        "calls": usage.total_calls(),
        "saving": None if result.validation is None or result.validation.saving is None
        else result.validation.saving.relative,
        "returned": result.best_instruction != INITIAL,
    }


def simulate(*, seeds: int, n_opt: int, n_val: int, steps: int, k: int) -> list[dict[str, Any]]:
    cache: dict[float, float] = {}

    def mean_of(effect: float) -> float:
        if effect not in cache:
            cache[effect] = true_mean(effect, n=50_000)
        return cache[effect]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rule in ("old", "new"):
            started = time.perf_counter()
            runs = [run_once(World(s), rule=rule, n_opt=n_opt, n_val=n_val, steps=steps, k=k, folder=Path(tmp))
                    for s in range(seeds)]
            base = mean_of(0.0)
            bias = [r["reported"] - mean_of(r["returned_effect"]) for r in runs]
            worse = [mean_of(r["returned_effect"]) <= base - 0.25 for r in runs]
            good = [r for r in runs if mean_of(r["best_proposed_effect"]) >= base + 0.5]
            found = [mean_of(r["returned_effect"]) >= base + 0.5 for r in good]
            rows.append({
                "rule": rule,
                "seeds": seeds,
                "bias": float(np.mean(bias)),
                "bias_se": float(np.std(bias, ddof=1) / math.sqrt(len(bias))),
                "p_worse": float(np.mean(worse)),
                "p_claims_gain": float(np.mean([r["claims_gain"] for r in runs])),
                "p_finds_better": float(np.mean(found)) if found else math.nan,
                "n_better_proposed": len(good),
                "true_gain_returned": float(np.mean([mean_of(r["returned_effect"]) - base for r in runs])),
                "calls_per_run": float(np.mean([r["calls"] for r in runs])),
                "seconds": time.perf_counter() - started,
            })
    return rows


def power(*, seeds: int, n_opt: int, n_val: int, steps: int, k: int, design: dict[str, Any],
          effects: Sequence[float] = (0.0, 0.5, 1.0), n_unused: int = 0, world: Kind = "rounded") -> list[dict[str, Any]]:
    """Worlds where about 1 proposal in 6 is truly better by ``effect`` (judge points before rounding)
    and the rest are equal to the initial instruction: how often the validated search returns a
    better one, how often it claims a gain in the null world (and whether a rerun with a looser
    alpha can claim one), and the bias of the reported gain among the runs that claim one."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for effect in effects:
            started = time.perf_counter()
            runs, reruns = [], 0
            for s in range(seeds):
                truth = World(s, better_by=effect, kind=world)
                folder = Path(tmp) / f"e{effect}"
                folder.mkdir(exist_ok=True)
                runs.append(run_once(truth, rule="new", n_opt=n_opt, n_val=n_val, steps=steps, k=k, folder=folder,
                                     design=design, n_unused=n_unused))
                if effect == 0.0 and s < min(seeds, 50):
                    # The alpha-shopping rerun: the same study and questions, a looser alpha.
                    try:
                        again = run_once(truth, rule="new", n_opt=n_opt, n_val=n_val, steps=steps, k=k,
                                         folder=folder, design={**design, "alpha": min(0.5, 4 * design.get("alpha", 0.05))},
                                         n_unused=n_unused)
                        reruns += bool(again["claims_gain"]) and not runs[-1]["claims_gain"]
                    except ConfigError:
                        pass
            base = true_mean(0.0, n=50_000, world=world, initial=True)
            better = true_mean(effect, n=50_000, world=world) - base
            claims = [r for r in runs if r["claims_gain"]]  # a claim returns a finalist, never the initial one
            gains = [true_mean(r["returned_effect"], n=50_000, world=world) - base for r in claims]
            bias = [r["reported_gain"] - t for r, t in zip(claims, gains, strict=True)]
            raw_bias = [r["raw_gain"] - t for r, t in zip(claims, gains, strict=True)]
            covered = [r["gain_ci"][0] <= t <= r["gain_ci"][1] for r, t in zip(claims, gains, strict=True)]
            rows.append({
                "effect": effect, "true_gain": better, "seeds": seeds,
                # Among the seeds whose search proposed a better prompt (about 1 in 6 proposals is).
                "p_returns_better": float(np.mean([r["returned_effect"] > 0 for r in runs
                                                   if r["best_proposed_effect"] > 0] or [math.nan])) if effect else math.nan,
                "p_proposed": float(np.mean([r["best_proposed_effect"] > 0 for r in runs])),
                "p_claims": float(np.mean([r["claims_gain"] for r in runs])),
                "rerun_new_claims": reruns,
                "gain_bias": float(np.mean(bias)) if bias else math.nan,
                "gain_bias_se": float(np.std(bias, ddof=1) / math.sqrt(len(bias))) if len(bias) > 1 else math.nan,
                "raw_bias": float(np.mean(raw_bias)) if raw_bias else math.nan,
                "ci_coverage": float(np.mean(covered)) if covered else math.nan,
                "calls_per_run": float(np.mean([r["calls"] for r in runs])),
                "calls_max": max(r["calls"] for r in runs),
                "open_below": sum(r["gain_ci"][0] == -math.inf for r in claims),
                "seconds": time.perf_counter() - started,
            })
    return rows


def effect_for(difference: float, *, world: Kind = "rounded", noise_sd: float = 0.0) -> float:
    """The shift (judge points before rounding or clipping) whose mean judge score differs by ``difference``."""
    def measured_gap(shift: float) -> float:
        a, b = measured_pairs(np.random.default_rng(11), 200_000, shift=shift, noise_sd=noise_sd)
        return float(b.mean() - a.mean())

    if world in ("t3", "skewed"):
        return world_effect_for(difference, world)
    if world == "measured":
        gap = measured_gap
    else:
        base = true_mean(0.0, n=50_000)
        gap = lambda shift: true_mean(shift, n=50_000) - base  # noqa: E731
    return solve(gap, difference, lo=difference * 2 - 0.5, hi=0.0, steps=30)


def cost_power(*, seeds: int, n_opt: int, n_val: int, steps: int, k: int, design: dict[str, Any],
               n_unused: int = 0, world: Kind = "rounded", paired_sd: float = float(np.median(MEASURED_SDS)),
               ) -> list[dict[str, Any]]:
    """(d): the cost objective in a world where the cheaper proposals are truly equal, and in one
    where they are truly worse by the margin; ``world`` ``measured``: with paired sd ``paired_sd``."""
    design = {"objective": "cost", "margin": 0.25, **design}
    noise_sd = noise_for(paired_sd, 3.0 if world == "t3" else 0.0) if world in ("measured", "t3") else 0.0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, difference in (("equal", 0.0), ("worse by the margin", -float(design["margin"]))):
            started = time.perf_counter()
            shift = effect_for(difference, world=world, noise_sd=noise_sd) if difference else 0.0
            folder = Path(tmp) / name.replace(" ", "-")
            folder.mkdir()
            runs = [run_once(CheaperWorld(s, effect=shift, kind=world, noise_sd=noise_sd), rule="new", n_opt=n_opt, n_val=n_val, steps=steps, k=k,
                             folder=folder, design=design, n_unused=n_unused) for s in range(seeds)]
            returned = [r["returned"] for r in runs]
            savings = [r["saving"] for r in runs if r["returned"] and r["saving"] is not None]
            rows.append({
                "world": name, "kind": world, "paired_sd": paired_sd if world in ("measured", "t3") else None,
                "difference": difference, "shift": shift, "seeds": seeds,
                "p_returned": float(np.mean(returned)),
                "p_returned_se": float(np.std(returned, ddof=1) / math.sqrt(len(returned))) if len(returned) > 1 else math.nan,
                "saving": float(np.mean(savings)) if savings else math.nan,
                "calls_per_run": float(np.mean([r["calls"] for r in runs])),
                "seconds": time.perf_counter() - started,
            })
    return rows


def print_cost(rows: list[dict[str, Any]], *, design: dict[str, Any], n_opt: int, n_val: int, steps: int, k: int,
               n_unused: int = 0) -> None:
    world = rows[0]["kind"] if rows else "rounded"
    judge = (f"{world} judge (paired sd {rows[0]['paired_sd']:.2f} at equal quality, {MEASURED_TIES:.0%} ties)"
             if world in ("measured", "t3") else f"{world} judge")
    print(f"(d) cost objective, {judge}: {steps} steps x {k} candidates, {n_opt} optimization and {n_val} validation "
          f"questions, {n_unused} unused to extend into, design {design}; every proposal's answers are "
          f"{SHORT_ANSWER} filler words instead of {LONG_ANSWER}")
    print("| world (true mean-score difference) | seeds | P(cheaper one returned, with a non-inferiority claim) "
          "| mean claimed saving per answer | calls/run | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        saving = "n/a" if math.isnan(r["saving"]) else f"{r['saving']:.0%}"
        print(f"| {r['world']} ({r['difference']:+.2f}) | {r['seeds']} | {r['p_returned']:.3f} ± {r['p_returned_se']:.3f} "
              f"| {saving} | {r['calls_per_run']:.0f} | {r['seconds']:.0f} |")


def print_power(rows: list[dict[str, Any]], *, design: dict[str, Any], n_opt: int, n_val: int, steps: int,
                k: int, n_unused: int = 0, world: Kind = "rounded") -> None:
    print(f"(c) power, {world} world: {steps} steps x {k} candidates, {n_opt} optimization and {n_val} validation "
          f"questions, {n_unused} unused questions to extend into, design {design}")
    print("| true effect (judge points; mean-score gain) | seeds | better one proposed | P(returns it, when proposed) "
          "| P(claims a gain) | new claims by an alpha x4 rerun | bias of the claimed gain (unadjusted) "
          "| its 95% CI covers (open below) | calls/run: mean, max | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        better = "n/a" if math.isnan(r["p_returns_better"]) else f"{r['p_returns_better']:.3f}"
        bias = "n/a" if math.isnan(r["gain_bias"]) else f"{r['gain_bias']:+.3f} ± {r['gain_bias_se']:.3f}"
        if not math.isnan(r["raw_bias"]):
            bias += f" ({r['raw_bias']:+.3f})"
        cover = "n/a" if math.isnan(r["ci_coverage"]) else f"{r['ci_coverage']:.2f}"
        proposed = "n/a" if not r["effect"] else f"{r['p_proposed']:.2f}"
        print(f"| +{r['effect']:.1f} ({r['true_gain']:+.2f}) | {r['seeds']} | {proposed} | {better} | {r['p_claims']:.3f} "
              f"| {r['rerun_new_claims']} | {bias} | {cover} ({r['open_below']}) "
              f"| {r['calls_per_run']:.0f}, {r['calls_max']} | {r['seconds']:.0f} |")


#: A run whose studentized sum ``sum / sqrt(sum of squares)`` stays below this at every look it
#: reaches cannot claim: the sign-flip boundaries sit near 1.65 at the last look and higher before.
SCREEN = 1.2


def _reaches(d: np.ndarray, sizes: Sequence[int], futility: bool) -> np.ndarray:
    """The runs (rows of paired differences) whose studentized sum reaches :data:`SCREEN` at some
    look before they would stop for futility."""
    rows = len(d)
    reached = np.zeros(rows, dtype=bool)
    alive = np.ones(rows, dtype=bool)
    for k, n in enumerate(sizes):
        total = d[:, :n].sum(1)
        scale = np.sqrt((d[:, :n] ** 2).sum(1))
        z = np.divide(total, scale, out=np.zeros(rows), where=scale > 0)
        reached |= alive & (z >= SCREEN)
        if futility and k < len(sizes) - 1:
            alive &= total > 0
    return reached


def _decide_run(d: np.ndarray, sizes: Sequence[int], *, alpha: float, futility: bool, seed: int) -> int:
    """The real test on one run: the questions seen at the look that claimed, 0 if none did."""
    from opro.stats.sequential import decide

    looks: list[Any] = []
    for k, n in enumerate(sizes, start=1):
        look = decide(list(np.clip(d[:n], -4.0, 4.0)), seen=sizes[:k], n_max=sizes[-1], last=k == len(sizes),
                      earlier=looks, alpha=alpha, scale=(SCORE_MIN, SCORE_MAX), futility=futility, seed=seed)
        looks.append(look)
        if look.decision == "success":
            return n
        if look.decision != "continue":
            return 0
    return 0


def coverage(*, world: Kind, effects: Sequence[float], claims: int, max_runs: int, n_val: int = 48,
             n_unused: int = 20, checks: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    """The validation stage alone at the default design: the chosen finalist (better by ``effect``
    judge points before rounding) against the initial instruction on the confirmation questions, in
    batches of 2,000 runs until ``claims`` claims or ``max_runs`` runs; each claim's conditional
    interval checked against the true mean-score gain."""
    from opro.search.validation_sizes import confirmation_looks, split_sizes
    from opro.stats.sequential import conditional_estimate
    from opro.testing.score_worlds import paired_scores, truth

    settings = validation_settings(OptimizerSection())
    _, n_conf = split_sizes(settings, n_val, settings.finalists)
    sizes = confirmation_looks(settings, n_conf, n_unused)
    alpha, futility = settings.alpha, settings.futility
    rng = np.random.default_rng(seed)
    rows = []
    for effect in effects:
        started = time.perf_counter()
        gain = truth(effect, world)[1]
        runs = screened = checked = missed = 0
        found: list[tuple[float, float, float, float]] = []  # (low, high, adjusted, raw)
        while len(found) < claims and runs < max_runs:
            a, b = paired_scores(rng, sims=2000, n=sizes[-1], effect=effect, world=world)
            d = a - b
            reach = _reaches(d, sizes, futility)
            for i in range(len(d)):
                runs += 1
                if not reach[i]:
                    screened += 1
                    if checked < checks:  # the screen, checked: the real test on a run it left out
                        missed += _decide_run(d[i], sizes, alpha=alpha, futility=futility, seed=runs) > 0
                        checked += 1
                    continue
                n = _decide_run(d[i], sizes, alpha=alpha, futility=futility, seed=runs)
                if n:
                    est = conditional_estimate(list(d[i, :n]), sizes=sizes, alpha=alpha, scale=(SCORE_MIN, SCORE_MAX),
                                               futility=futility, seed=runs)
                    found.append((est.ci[0], est.ci[1], est.gain, est.raw))
                    if len(found) == claims:
                        break
        low, high, adjusted, raw = (np.array(x) for x in zip(*found, strict=True)) if found else (np.array([]),) * 4
        rows.append({
            "world": world, "effect": effect, "true_gain": gain, "runs": runs, "claims": len(found),
            "p_claims": len(found) / runs,
            "covers": float(np.mean((low <= gain) & (gain <= high))) if found else math.nan,
            "open_below": float(np.mean(low == -math.inf)) if found else math.nan,
            "median_bias": float(np.median(adjusted) - gain) if found else math.nan,
            "raw_median_bias": float(np.median(raw) - gain) if found else math.nan,
            "screened": screened, "checked": checked, "missed": missed, "sizes": sizes,
            "seconds": time.perf_counter() - started,
        })
    return rows


def print_coverage(rows: list[dict[str, Any]]) -> None:
    r0 = rows[0]
    print(f"(e) the claimed gain's 95% conditional interval, {r0['world']} world, confirmation looks at "
          f"{', '.join(map(str, r0['sizes']))} paired questions (the defaults: 48 validation questions, 20 unused)")
    print("| effect (judge points) | true gain | runs | claims | P(claim) | interval covers | open below "
          "| median of adjusted - true (raw) | screened out (checked, claimed) | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['effect']:+.2f} | {r['true_gain']:+.2f} | {r['runs']} | {r['claims']} | {r['p_claims']:.4f} | **{r['covers']:.3f}** "
              f"| {r['open_below']:.2f} | {r['median_bias']:+.3f} ({r['raw_median_bias']:+.3f}) "
              f"| {r['screened']} ({r['checked']}, {r['missed']}) | {r['seconds']:.0f} |")


def print_simulation(rows: list[dict[str, Any]], *, n_opt: int, n_val: int, steps: int, k: int) -> None:
    print(f"(a) simulation: {1 + steps * k} candidates, {n_opt} optimization questions, {n_val} validation "
          f"questions (new rule only), judge noise sd {math.hypot(QUESTION_SD, NOISE_SD):.2f}")
    print("| rule | seeds | bias of reported score | P(returned truly worse by >= 0.25) | P(claims a gain) "
          "| P(returns a truly better prompt, when proposed) | mean true gain of returned | calls/run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = "old: search arg-max, in-sample score" if r["rule"] == "old" else "new: validated finalist (Holm)"
        print(f"| {name} | {r['seeds']} | {r['bias']:+.3f} ± {r['bias_se']:.3f} | {r['p_worse']:.3f} "
              f"| {r['p_claims_gain']:.3f} | {r['p_finds_better']:.3f} ({r['n_better_proposed']} seeds) "
              f"| {r['true_gain_returned']:+.3f} | {r['calls_per_run']:.0f} |")


def print_run(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"(b) real run: {run_dir}")
    print(f"returned instruction: {summary['best_instruction']!r}")
    print(f"headline: {summary['headline']}")
    v = summary.get("validation") or {}
    print("| prompt | search score (optimization, in-sample) | validation score | held-out score |")
    print("|---|---|---|---|")
    heldout: dict[str, float] = {}
    reports = sorted((run_dir / "compare").glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    if reports:
        report = json.loads(reports[-1].read_text())
        for p in report.get("prompts", []):
            if p.get("mean") is not None:
                heldout[p["instruction"].strip()] = p["mean"]["estimate"]
    print(f"| initial | {summary['initial_score']} | {v.get('initial_score')} "
          f"| {heldout.get(summary['initial_instruction'].strip(), 'n/a')} |")
    for i, f in enumerate(v.get("finalists", []), start=1):
        print(f"| finalist {i} | {f['search_score']:.2f} | {f['validation_score']} "
              f"| {heldout.get(f['instruction'].strip(), 'n/a')} |")


def _errors(args: argparse.Namespace) -> int:
    """(g): the validation stage's test alone, before and now (experiments/validation_errors.py)."""
    from validation_errors import NULLS, POWERS, errors, print_errors

    explicit = any(a.startswith("--world") for a in sys.argv[1:])
    rows = [r for r in (*NULLS, *POWERS) if not explicit or r[1] == args.world]
    print_errors(errors(runs=args.runs, rows=rows, today_runs=args.today_runs))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--optimization", type=int, default=4, help="optimization questions (quickstart: 4)")
    ap.add_argument("--validation", type=int, default=10)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=3)
    ap.add_argument("--run-dir", type=Path, help="print (b) for this run folder instead of simulating")
    ap.add_argument("--power", action="store_true", help="(c): fixed true effects 0, +0.5, +1.0 instead of (a)")
    ap.add_argument("--cost", action="store_true", help="(d): the cost objective's two worlds instead of (a)")
    ap.add_argument("--space", action="store_true",
                    help="(f), with --cost: the settings-space world, today's search beside this one")
    ap.add_argument("--effects", default="0,0.5,1", help="(c): the true effects, comma-separated")
    ap.add_argument("--design", default="{}", help='validation settings as JSON, e.g. \'{"finalists": 2}\'')
    ap.add_argument("--unused", type=int, default=20,
                    help="questions in no split that the validation may extend into ([optimizer].validation_extension)")
    ap.add_argument("--world", choices=("rounded", "realistic", "measured", "t3", "skewed", "skewed-gains", "tied",
                                        "clustered"),
                    default="rounded", help="(c), (e): rounded or realistic; (d): rounded, measured, t3 or skewed; "
                    "(g): one world only (see the module docstring)")
    ap.add_argument("--search", choices=("both", "today", "this"), default="both",
                    help="--cost --space: the searches to run (today's, this one, or both)")
    ap.add_argument("--today-runs", type=int, help="--errors: run the flips of Hall's statistic (the test before) "
                    "on this many of the runs only (they take seconds per hundred runs; default: all)")
    ap.add_argument("--errors", action="store_true", help="(g): the validation stage's test alone in every world")
    ap.add_argument("--runs", type=int, default=2000, help="(g): runs per row")
    ap.add_argument("--paired-sd", type=float, default=float(np.median(MEASURED_SDS)),
                    help="(d), --world measured: the paired differences' sd at equal quality (default: the median measured)")
    ap.add_argument("--coverage", action="store_true", help="(e): the claimed gain's interval at fixed true gains")
    ap.add_argument("--claims", type=int, default=200, help="(e): claims to collect per effect")
    ap.add_argument("--max-runs", type=int, default=100_000, help="(e): runs at most per effect")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    if args.run_dir:
        print_run(args.run_dir)
        return 0
    effects = [float(e) for e in args.effects.split(",")]
    if args.errors:
        return _errors(args)
    if args.world in ("tied", "clustered"):
        ap.error(f"--world {args.world} is a world of --errors (the validation stage's test alone)")
    if args.world in ("measured", "t3", "skewed") and not args.cost:
        ap.error(f"--world {args.world} is a world of the cost objective (or of --errors): add --cost")
    if args.world == "skewed-gains":
        ap.error("--world skewed-gains is a world of --errors")
    if args.cost and args.space:
        from bench_cost_space import print_space, space_power

        extra = json.loads(args.design)
        srows = space_power(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, n_unused=args.unused,
                            steps=args.steps, k=args.candidates, design=extra, paired_sd=args.paired_sd,
                            searches=("today", "this") if args.search == "both" else (args.search,))
        print_space(srows, n_opt=args.optimization, n_val=args.validation, n_unused=args.unused, steps=args.steps,
                    k=args.candidates, design=extra)
        return 0
    if args.cost:
        design = {"objective": "cost", "margin": 0.25, **json.loads(args.design)}
        crows = cost_power(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                           k=args.candidates, design=design, n_unused=args.unused, world=args.world,
                           paired_sd=args.paired_sd)
        print_cost(crows, design=design, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                   k=args.candidates, n_unused=args.unused)
        return 0
    if args.coverage:
        print_coverage(coverage(world=args.world, effects=effects, claims=args.claims, max_runs=args.max_runs,
                                n_val=args.validation, n_unused=args.unused))
        return 0
    if args.power:
        design = json.loads(args.design)
        prows = power(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                      k=args.candidates, design=design, effects=effects, n_unused=args.unused, world=args.world)
        print_power(prows, design=design, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                    k=args.candidates, n_unused=args.unused, world=args.world)
        return 0
    rows = simulate(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                    k=args.candidates)
    print_simulation(rows, n_opt=args.optimization, n_val=args.validation, steps=args.steps, k=args.candidates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
