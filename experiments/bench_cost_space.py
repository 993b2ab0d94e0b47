"""(f) The cost objective in a world with a settings space: is the one truly equal, cheaper setting found?

``python experiments/bench_selection.py --cost --space`` runs the real ``opro.search.Search`` with
``objective = "cost"`` over a search space of two dimensions of three choices (9 settings: ``top_k`` 1, 3, 5
and ``answer_max_tokens`` 48, 128, 256; the initial configuration is top_k 3 and 128 tokens). One setting,
top_k 1 with 128 tokens, is truly as good as the initial one and about 35% cheaper per answer; every other
one is truly worse by 0.5 (mean judge score). The optimizer's wordings change nothing (each truly equal to
the initial instruction), so the settings are the only lever. The judge is the measured one of (d) (its
paired sd at equal quality, 15% ties, continuous scores), with per-question effects: a setting's effect
differs from question to question around its mean (sd ``SPREAD``), as real settings help some questions
and hurt others.

Two searches, the same validation stage (today's group-sequential test: the search calls it through
``Search.run``):

* **today's**: the quality race (a candidate stopped once confidently worse than the best complete one) and
  the sampler alone choosing the settings;
* **this**: the objective-aware race (stopped only below ``-margin`` against the initial configuration, or
  dominated) and step 0's first moves (each dimension at its cheapest choice alone, then together).

Reported: how often the equal, cheaper setting is returned with a non-inferiority claim, how often a setting
worse than the margin is returned, how often the equal setting was evaluated at all, the saving claimed,
and the calls and seconds a run took.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from bench_world import INITIAL, EchoProgram, ReplyJudge, _normal, _uniform

from opro.config import OptimizerSection
from opro.experiment.settings import proposer_settings, pruner_settings, search_settings
from opro.llm import ChatClient, GenerationOptions, Message, UsageLedger
from opro.llm.scripted import ScriptedLLM
from opro.search import (
    CandidateScorer,
    RacingPruner,
    Search,
    SearchStudy,
    make_proposer,
    make_pruner,
    open_storage,
)
from opro.search.space import SearchSpace
from opro.testing.score_worlds import MEASURED_LEVEL, MEASURED_LEVEL_SD, MEASURED_SDS, MEASURED_TIES, solve
from opro.testing.worlds import Ex

SPACE = {"top_k": [1, 3, 5], "answer_max_tokens": [48, 128, 256]}
INITIAL_SETTINGS = {"top_k": 3, "answer_max_tokens": 128}
#: The one setting as good as the initial configuration (and cheaper).
EQUAL = {"top_k": 1, "answer_max_tokens": 128}
#: Words a retrieved chunk adds to the task prompt; words of an answer under each cap.
CHUNK_WORDS = 56
ANSWER_WORDS = {48: 20, 128: 30, 256: 30}
#: The sd of a setting's per-question effect around its mean (judge points).
SPREAD = 0.3
WORSE_BY = 0.5


@dataclass(frozen=True)
class SettingsTemplate:
    """A bench template that carries the two settings: its text is the instruction, the settings, and the
    retrieved chunks (``top_k`` of them, what the prompt costs)."""

    instruction: str
    top_k: int = 3
    answer_max_tokens: int = 128

    @property
    def template_text(self) -> str:
        return f"{self.header()}\n{{context_str}}\nQuery: {{query_str}}\nAnswer: "

    def header(self) -> str:
        return f"{self.instruction} [top_k={self.top_k}, answer_max_tokens={self.answer_max_tokens}]"

    def setting(self, name: str) -> Any:
        return getattr(self, name, None) if name in INITIAL_SETTINGS else None

    def with_instruction(self, instruction: str) -> SettingsTemplate:
        return replace(self, instruction=instruction)

    def with_settings(self, **settings: Any) -> SettingsTemplate:
        return replace(self, **{k: int(v) for k, v in settings.items() if k in INITIAL_SETTINGS and v is not None})

    def __str__(self) -> str:
        return self.header() + "\n" + " chunk" * (CHUNK_WORDS * self.top_k)


def settings_of(answer: str) -> dict[str, int]:
    """The settings an answer was given under (its header)."""
    inside = answer.split(" [", 1)[1].split("]", 1)[0]
    return {k: int(v) for k, v in (item.split("=") for item in inside.split(", "))}


def answer_to(prompt: str) -> str:
    """The task model: the header (the instruction and settings) and as many words as the cap allows."""
    header = prompt.split("\n", 1)[0]
    return header + " word" * ANSWER_WORDS[settings_of(header)["answer_max_tokens"]]


def true_cost(values: Mapping[str, Any]) -> float:
    """What an answer under these settings costs in this world (task prompt + 4 x completion words)."""
    template = SettingsTemplate(INITIAL).with_settings(**values)
    prompt = f"{template}\nQuery: opt 0-0?"
    return len(prompt.split()) + 4.0 * len(answer_to(prompt).split())


def price(values: Mapping[str, Any]) -> float:
    """The cost per answer the plan would estimate for these settings (prompt + 4 x completion words)."""
    return CHUNK_WORDS * float(values["top_k"]) + 4.0 * ANSWER_WORDS[int(values["answer_max_tokens"])]


class SpaceWorld:
    """One seed's truth: the settings' effects (0 for the initial and the equal setting, ``shift`` for
    every other), per-question effects around them, the measured judge's noise and ties."""

    def __init__(self, seed: int, *, shift: float, noise_sd: float, spread: float = SPREAD) -> None:
        self.seed, self.shift, self.noise_sd, self.spread = seed, shift, noise_sd, spread

    def effect(self, settings: Mapping[str, int]) -> float:
        return 0.0 if dict(settings) in (INITIAL_SETTINGS, EQUAL) else self.shift

    def judge(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        text = messages[-1].content
        answer = text.split("Answer: ", 1)[1].split("\nReference:")[0]
        question = text.split("Question: ", 1)[1].split("\n")[0]
        settings = settings_of(answer)
        level = MEASURED_LEVEL + MEASURED_LEVEL_SD * _normal(self.seed, "q", question)
        initial = f"{INITIAL} [top_k=3, answer_max_tokens=128]" + " word" * ANSWER_WORDS[128]
        if _uniform(self.seed, "same", question) < MEASURED_TIES or answer == initial:
            # A tie: the initial answer's verdict (which this is, or is judged alike).
            return f"{min(5.0, max(1.0, level + self.noise_sd * _normal(self.seed, 'n', question, initial))):.4f}"
        key = tuple(sorted(settings.items()))
        moved = self.effect(settings) + self.spread * _normal(self.seed, "spread", question, key)
        noise = self.noise_sd * _normal(self.seed, "n", question, answer)
        return f"{min(5.0, max(1.0, level + moved + noise)):.4f}"

    def propose(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return f"<INS>Candidate {options.seed} of world {self.seed}.</INS>"


def _pairs(rng: np.random.Generator, n: int, *, shift: float, noise_sd: float, spread: float) -> np.ndarray:
    """``n`` paired differences (other - initial) of the world's judge, for its calibration."""
    level = MEASURED_LEVEL + rng.normal(0, MEASURED_LEVEL_SD, n)
    same = rng.random(n) < MEASURED_TIES
    a = np.clip(level + rng.normal(0, noise_sd, n), 1, 5)
    b = np.clip(level + shift + spread * rng.normal(size=n) + rng.normal(0, noise_sd, n), 1, 5)
    return np.where(same, 0.0, b - a)


def calibrate(paired_sd: float, *, spread: float = SPREAD) -> tuple[float, float]:
    """(per-answer noise, shift): the noise whose paired differences at equal quality have sd
    ``paired_sd`` (the per-question effects included), and the shift whose mean difference is -0.5."""
    def sd(noise: float) -> float:
        return float(np.std(_pairs(np.random.default_rng(7), 200_000, shift=0.0, noise_sd=noise, spread=spread)))

    noise = solve(sd, paired_sd, lo=0.01, hi=3.0, steps=40)

    def gap(shift: float) -> float:
        return float(np.mean(_pairs(np.random.default_rng(11), 200_000, shift=shift, noise_sd=noise, spread=spread)))

    return noise, solve(gap, -WORSE_BY, lo=-2 * WORSE_BY - 0.5, hi=0.0, steps=30)


def run_once(world: SpaceWorld, *, search: str, n_opt: int, n_val: int, n_unused: int, steps: int, k: int,
             folder: Path, design: Mapping[str, Any]) -> dict[str, Any]:
    """One seed, one search (``today`` or ``this``), run whole through ``Search.run``."""
    usage = UsageLedger()
    settings = OptimizerSection(**{"steps": steps, "candidates_per_step": k, "minibatch_size": 2, "pruner": "race",
                                   "objective": "cost", "margin": 0.25, **design})
    # Today's race knew no objective: the quality race, whatever the objective; and no first moves.
    pruner = (RacingPruner(confidence=settings.race_confidence, warmup=settings.prune_warmup_minibatches)
              if search == "today" else make_pruner(pruner_settings(settings)))
    space = SearchSpace(dimensions=SPACE, initial=INITIAL_SETTINGS, objective="cost", seed=world.seed,
                        price=None if search == "today" else price)
    program = EchoProgram(ChatClient(ScriptedLLM(default=lambda m, o: answer_to(m[-1].content)), role="task",
                                     usage=usage))
    study = SearchStudy.open(open_storage(f"sqlite:///{folder / f'{search}-{world.seed}.db'}"), name="bench",
                             pruner=pruner)
    started = time.perf_counter()
    result = Search(
        make_proposer(settings=proposer_settings(settings), seed=world.seed, template_text=SettingsTemplate("<INS>").template_text,
                      llm=ChatClient(ScriptedLLM(default=world.propose), role="optimizer", usage=usage, seed=world.seed)),
        CandidateScorer(program=program, template=SettingsTemplate(""), space=space,
                        judge=ReplyJudge(ChatClient(ScriptedLLM(default=world.judge), role="judge", usage=usage))),
        study, search_settings(settings), usage=usage, seed=world.seed, progress=False,
    ).run(
        optimization_set=[Ex(f"opt {world.seed}-{i}?", "r") for i in range(n_opt)],
        validation_set=[Ex(f"val {world.seed}-{i}?", "r") for i in range(n_val)],
        extension_set=[Ex(f"unused {world.seed}-{i}?", "r") for i in range(n_unused)],
        exemplar_set=[Ex("exemplar?", "r")], initial=[INITIAL],
    )
    returned = {k: int(v) for k, v in result.best_params.items()}
    v = result.validation
    return {
        "equal": result.validated and returned == EQUAL,
        "worse": result.validated and world.effect(returned) < 0,
        "tried": any({k: int(x) for k, x in r.params.items()} == EQUAL for r in result.history),
        "saving": v.saving.relative if result.validated and v is not None and v.saving is not None else None,
        "calls": usage.total_calls(),
        "seconds": time.perf_counter() - started,
    }


def space_power(*, seeds: int, n_opt: int, n_val: int, n_unused: int, steps: int, k: int,
                design: Mapping[str, Any], paired_sd: float = float(np.median(MEASURED_SDS)),
                searches: tuple[str, ...] = ("today", "this")) -> list[dict[str, Any]]:
    """The searches (``today``, ``this``) over ``seeds`` worlds; a row each."""
    noise, shift = calibrate(paired_sd)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for search in searches:
            runs = [run_once(SpaceWorld(s, shift=shift, noise_sd=noise), search=search, n_opt=n_opt, n_val=n_val,
                             n_unused=n_unused, steps=steps, k=k, folder=Path(tmp), design=design) for s in range(seeds)]

            def p(key: str, runs: list[dict[str, Any]] = runs) -> tuple[float, float]:
                x = [float(r[key]) for r in runs]
                return float(np.mean(x)), float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan

            savings = [r["saving"] for r in runs if r["saving"] is not None]
            rows.append({"search": search, "seeds": seeds, "paired_sd": paired_sd, "noise_sd": noise, "shift": shift,
                         "equal": p("equal"), "worse": p("worse"), "tried": p("tried"),
                         "saving": float(np.mean(savings)) if savings else math.nan,
                         "calls": float(np.mean([r["calls"] for r in runs])),
                         "seconds": float(np.mean([r["seconds"] for r in runs]))})
    return rows


def print_space(rows: list[dict[str, Any]], *, n_opt: int, n_val: int, n_unused: int, steps: int, k: int,
                design: Mapping[str, Any]) -> None:
    r0 = rows[0]
    saving = 1 - true_cost(EQUAL) / true_cost(INITIAL_SETTINGS)
    print(f"(f) cost objective over a settings space (top_k {SPACE['top_k']} x answer_max_tokens "
          f"{SPACE['answer_max_tokens']}, initial top_k 3 / 128): top_k 1 / 128 truly equal and {saving:.0%} cheaper, "
          f"every other setting worse by {WORSE_BY:g} (shift {r0['shift']:+.2f}, per-question sd {SPREAD:g}); measured judge "
          f"(paired sd {r0['paired_sd']:.2f} at equal quality, {MEASURED_TIES:.0%} ties); {steps} steps x {k} candidates, "
          f"{n_opt} optimization / {n_val} validation / {n_unused} unused questions, design {dict(design)}")
    print("| search | seeds | equal setting evaluated | P(equal cheaper setting returned) "
          "| P(a setting worse than the margin returned) | mean claimed saving | calls/run | seconds/run |")
    print("|---|---|---|---|---|---|---|---|")
    names = {"today": "today's: quality race, sampler only", "this": "objective-aware race + first moves"}
    for r in rows:
        saved = "n/a" if math.isnan(r["saving"]) else f"{r['saving']:.0%}"
        print(f"| {names[r['search']]} | {r['seeds']} | {r['tried'][0]:.2f} | **{r['equal'][0]:.3f}** ± {r['equal'][1]:.3f} "
              f"| {r['worse'][0]:.3f} ± {r['worse'][1]:.3f} | {saved} | {r['calls']:.0f} | {r['seconds']:.1f} |")


__all__ = ["SpaceWorld", "print_space", "run_once", "space_power"]
