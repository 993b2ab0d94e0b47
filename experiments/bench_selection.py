"""How honest is the returned prompt? The old selection rule against the validated one.

(a) Simulation (scripted models, no LLM; a couple of minutes). Each seed draws true effects for the
candidates the optimizer proposes (most are no better than the initial instruction, some worse, a
few better), and a judge scores 1-5 with a per-question level plus per-call noise, sized like the
embedded 1.5B judge on 0.5B RAG answers (README calibration: scores spread over 1-4, sd about 1.2).
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

    python experiments/bench_selection.py --seeds 200
    python experiments/bench_selection.py --power --seeds 200 --optimization 6 --validation 48 --unused 20
    python experiments/bench_selection.py --run-dir runs/history_of_alexnet
    python experiments/bench_selection.py --cost --seeds 200 --optimization 6 --validation 48 --unused 20

(d) ``--cost``: ``[optimizer].objective = "cost"`` (margin 0.25). Every proposal's answers are 30%
shorter than the initial instruction's (its cost per answer about 30% lower), and
its quality is either truly equal or truly worse by the margin (mean judge score, after rounding).
Reported: how often the cheaper configuration is returned with a non-inferiority claim (the issue's
aims: >= 0.8 where equal, <= alpha over all looks where worse by the margin), and the saving claimed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opro.config import OptimizerSection
from opro.errors import ConfigError
from opro.llm import ChatClient, GenerationOptions, Message, UsageLedger
from opro.llm.scripted import ScriptedLLM
from opro.search import CandidateScorer, Search, SearchStudy, make_proposer, make_pruner, open_storage

INITIAL = "Answer the question."
BASE_LEVEL = 3.0
QUESTION_SD = 0.6  # how much questions differ in difficulty (shared by every prompt: the pairing)
NOISE_SD = 0.9  # per-call judge noise; with QUESTION_SD the spread of a prompt's scores is about 1.1


@dataclass(frozen=True)
class Ex:
    query: str
    reference_answer: str


@dataclass(frozen=True)
class TextTemplate:
    """A QA template that is its instruction (what EchoProgram answers with)."""

    instruction: str

    @property
    def template_text(self) -> str:
        return f"{self.instruction}\n{{context_str}}\nQuery: {{query_str}}\nAnswer: "

    def with_instruction(self, instruction: str) -> TextTemplate:
        return TextTemplate(instruction)

    def __str__(self) -> str:
        return self.instruction


@dataclass(frozen=True)
class Verdict:
    score: float | None
    invalid: bool


def _normal(*parts: object) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    u1 = (int.from_bytes(digest[:8], "big") + 1) / (2**64 + 2)
    u2 = int.from_bytes(digest[8:16], "big") / 2**64
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def _score(level: float) -> float:
    return float(min(5, max(1, round(level))))


def true_mean(effect: float, n: int = 200_000) -> float:
    """Expected judge score of a prompt with this effect, over questions and noise (Monte Carlo)."""
    rng = np.random.default_rng(12345)
    x = BASE_LEVEL + effect + rng.normal(0, QUESTION_SD, n) + rng.normal(0, NOISE_SD, n)
    return float(np.clip(np.round(x), 1, 5).mean())


class World:
    """One seed's truth: the effect of every instruction the optimizer can propose."""

    def __init__(self, seed: int, *, better_by: float | None = None) -> None:
        self.seed = seed
        #: None: the mixture below; a number: about 1 proposal in 6 is better by it, the rest equal.
        self.better_by = better_by

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
        level = BASE_LEVEL + QUESTION_SD * _normal(self.seed, "q", question)
        noise = NOISE_SD * _normal(self.seed, "n", question, answer)
        return str(_score(level + self.effect(answer) + noise))

    def propose(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return f"<INS>Candidate {options.seed} of world {self.seed}.</INS>"


@dataclass(frozen=True)
class Echoed:
    """An answer with the call that made it (its tokens: what an answer costs)."""

    text: str
    completion: Any


class EchoProgram:
    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def answer(self, query: str, *, template: Any) -> Any:
        completion = self.client.complete(f"{template}\nQuery: {query}")
        return Echoed(completion.text, completion)


class ReplyJudge:
    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> Verdict:
        reply = self.client.complete(f"Grade.\nQuestion: {query}\nAnswer: {answer}\nReference: {reference}").text
        return Verdict(float(reply), False)


#: ``--cost``: filler words of the initial instruction's answers and of a proposal's, so that a
#: proposal's cost per answer (prompt + 4 x completion tokens, its instruction included) is about 30%
#: lower (measured and printed: the claimed saving).
LONG_ANSWER = 40
SHORT_ANSWER = 24


def _padded(instruction: str) -> str:
    """The cost world's answer: the instruction (what the judge reads the effect from), then filler."""
    return instruction + " word" * (LONG_ANSWER if instruction.startswith(INITIAL) else SHORT_ANSWER)


class CheaperWorld(World):
    """Every proposal is cheaper (shorter answers) and shifted in quality by ``effect``."""

    def __init__(self, seed: int, *, effect: float) -> None:
        super().__init__(seed)
        self.shift = effect

    def effect(self, instruction: str) -> float:
        return 0.0 if instruction.startswith(INITIAL) else self.shift


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
                             pruner=make_pruner(settings))
    search = Search(
        make_proposer(settings=settings, seed=world.seed, template_text=TextTemplate("<INS>").template_text,
                      llm=ChatClient(ScriptedLLM(default=world.propose), role="optimizer", usage=usage, seed=world.seed)),
        CandidateScorer(program=program, template=TextTemplate(""),
                        judge=ReplyJudge(ChatClient(ScriptedLLM(default=world.judge), role="judge", usage=usage))),
        study, settings, usage=usage, seed=world.seed, progress=False,
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
        else result.validation.saving.get("relative"),
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
          effects: Sequence[float] = (0.0, 0.5, 1.0), n_unused: int = 0) -> list[dict[str, Any]]:
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
                world = World(s, better_by=effect)
                folder = Path(tmp) / f"e{effect}"
                folder.mkdir(exist_ok=True)
                runs.append(run_once(world, rule="new", n_opt=n_opt, n_val=n_val, steps=steps, k=k, folder=folder,
                                     design=design, n_unused=n_unused))
                if effect == 0.0 and s < min(seeds, 50):
                    # The alpha-shopping rerun: the same study and questions, a looser alpha.
                    try:
                        again = run_once(world, rule="new", n_opt=n_opt, n_val=n_val, steps=steps, k=k,
                                         folder=folder, design={**design, "alpha": min(0.5, 4 * design.get("alpha", 0.05))},
                                         n_unused=n_unused)
                        reruns += bool(again["claims_gain"]) and not runs[-1]["claims_gain"]
                    except ConfigError:
                        pass
            base = true_mean(0.0, n=50_000)
            better = true_mean(effect, n=50_000) - base
            claims = [r for r in runs if r["claims_gain"]]
            truth = [true_mean(r["returned_effect"], n=50_000) - base for r in claims]
            bias = [r["reported_gain"] - t for r, t in zip(claims, truth, strict=True)]
            raw_bias = [r["raw_gain"] - t for r, t in zip(claims, truth, strict=True)]
            covered = [r["gain_ci"][0] <= t <= r["gain_ci"][1] for r, t in zip(claims, truth, strict=True)]
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
                "seconds": time.perf_counter() - started,
            })
    return rows


def effect_for(difference: float) -> float:
    """The shift (judge points before rounding) whose mean judge score differs by ``difference``."""
    base, lo, hi = true_mean(0.0, n=50_000), difference * 2 - 0.5, 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if true_mean(mid, n=50_000) - base < difference:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def cost_power(*, seeds: int, n_opt: int, n_val: int, steps: int, k: int, design: dict[str, Any],
               n_unused: int = 0) -> list[dict[str, Any]]:
    """(d): the cost objective in a world where the cheaper proposals are truly equal, and in one
    where they are truly worse by the margin."""
    design = {"objective": "cost", "margin": 0.25, **design}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, difference in (("equal", 0.0), ("worse by the margin", -float(design["margin"]))):
            started = time.perf_counter()
            shift = effect_for(difference) if difference else 0.0
            folder = Path(tmp) / name.replace(" ", "-")
            folder.mkdir()
            runs = [run_once(CheaperWorld(s, effect=shift), rule="new", n_opt=n_opt, n_val=n_val, steps=steps, k=k,
                             folder=folder, design=design, n_unused=n_unused) for s in range(seeds)]
            returned = [r["returned"] for r in runs]
            savings = [r["saving"] for r in runs if r["returned"] and r["saving"] is not None]
            rows.append({
                "world": name, "difference": difference, "shift": shift, "seeds": seeds,
                "p_returned": float(np.mean(returned)),
                "p_returned_se": float(np.std(returned, ddof=1) / math.sqrt(len(returned))) if len(returned) > 1 else math.nan,
                "saving": float(np.mean(savings)) if savings else math.nan,
                "calls_per_run": float(np.mean([r["calls"] for r in runs])),
                "seconds": time.perf_counter() - started,
            })
    return rows


def print_cost(rows: list[dict[str, Any]], *, design: dict[str, Any], n_opt: int, n_val: int, steps: int, k: int,
               n_unused: int = 0) -> None:
    print(f"(d) cost objective: {steps} steps x {k} candidates, {n_opt} optimization and {n_val} validation "
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
                k: int, n_unused: int = 0) -> None:
    print(f"(c) power: {steps} steps x {k} candidates, {n_opt} optimization and {n_val} validation questions, "
          f"{n_unused} unused questions to extend into, design {design}")
    print("| true effect (judge points; mean-score gain) | seeds | better one proposed | P(returns it, when proposed) "
          "| P(claims a gain) | new claims by an alpha x4 rerun | bias of the claimed gain (unadjusted) "
          "| its 95% CI covers | calls/run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        better = "n/a" if math.isnan(r["p_returns_better"]) else f"{r['p_returns_better']:.3f}"
        bias = "n/a" if math.isnan(r["gain_bias"]) else f"{r['gain_bias']:+.3f} ± {r['gain_bias_se']:.3f}"
        if not math.isnan(r["raw_bias"]):
            bias += f" ({r['raw_bias']:+.3f})"
        cover = "n/a" if math.isnan(r["ci_coverage"]) else f"{r['ci_coverage']:.2f}"
        proposed = "n/a" if not r["effect"] else f"{r['p_proposed']:.2f}"
        print(f"| +{r['effect']:.1f} ({r['true_gain']:+.2f}) | {r['seeds']} | {proposed} | {better} | {r['p_claims']:.3f} "
              f"| {r['rerun_new_claims']} | {bias} | {cover} | {r['calls_per_run']:.0f} |")


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
    ap.add_argument("--effects", default="0,0.5,1", help="(c): the true effects, comma-separated")
    ap.add_argument("--design", default="{}", help='validation settings as JSON, e.g. \'{"finalists": 2}\'')
    ap.add_argument("--unused", type=int, default=20,
                    help="questions in no split that the validation may extend into ([optimizer].validation_extension)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    if args.run_dir:
        print_run(args.run_dir)
        return 0
    if args.cost:
        design = {"objective": "cost", "margin": 0.25, **json.loads(args.design)}
        crows = cost_power(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                           k=args.candidates, design=design, n_unused=args.unused)
        print_cost(crows, design=design, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                   k=args.candidates, n_unused=args.unused)
        return 0
    if args.power:
        design = json.loads(args.design)
        prows = power(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                      k=args.candidates, design=design, effects=[float(e) for e in args.effects.split(",")],
                      n_unused=args.unused)
        print_power(prows, design=design, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                    k=args.candidates, n_unused=args.unused)
        return 0
    rows = simulate(seeds=args.seeds, n_opt=args.optimization, n_val=args.validation, steps=args.steps,
                    k=args.candidates)
    print_simulation(rows, n_opt=args.optimization, n_val=args.validation, steps=args.steps, k=args.candidates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
