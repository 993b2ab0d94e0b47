"""What a run will cost and what it can detect, before it runs (``opro plan``, ``opro optimize``'s first lines).

Four figures a user needs before spending an afternoon of LLM calls:

- **What it can detect.** The smallest true gain the validation stage claims in 80% of runs, for
  these split sizes and this judge's noise (:func:`opro.stats.sequential.design_power`), and the same for
  ``opro compare`` on the held-out questions; a warning where a significant result is impossible.
  The noise is the standard deviation of the per-question score difference of two prompts: from the
  last run's validation stage when there is one, else from ``opro judge calibrate`` (its test-retest
  noise, a lower bound: prompts also differ question by question), else a stated default.
- **What it will ask.** Calls and tokens per role, split into search, validation and dataset generation. The
  search figure is its maximum (no candidate pruned, which is what a search without clear losers does); the
  validation figure is its expectation when there is no gain (futility stops some runs early), its maximum beside it.
- **What an answer costs.** The task model's tokens per answer under each open choice of
  ``[search.space]`` (from the same prompt-length estimate), as a cost (:mod:`opro.program.cost`); under
  the cost objective also the smallest margin the split sizes confirm and the saving the space can give.
- **How long and how much.** Per-call tokens and seconds come from the last run in the same output
  folder when there is one (``summary.json``'s usage); else the tokens are estimated and the seconds
  come from the speed the role's model measured on this machine in the last command that used it
  (:mod:`opro.llm.rates`: the dataset generation, the first thing a first run does, is timed by the
  generator's measured rate once any command has used that model here), else from defaults measured
  on the embedded models (2 idle cores) or assumed for an endpoint; cost where the model has a price
  (its table's ``price_prompt`` / ``price_completion``, else the usage ledger's built-in table).

After a run, :func:`check` puts the estimate beside what happened.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from opro.config import OproConfig
from opro.experiment.settings import claim, validation_settings
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.llm.pool import ModelSpec
from opro.llm.rates import MeasuredRate, load_rates, rate_key, rates_path
from opro.paths import RunDir
from opro.probe.sizes import Clustering, clustering, extendable, heldout_detectable, needed_for, pool_command
from opro.program.choices import in_play
from opro.program.configurations import changed, settings_text
from opro.program.cost import amount
from opro.program.dimensions import (
    DIMENSIONS,
    Dimension,
    Value,
    answer_cost,
    dimension,
    initial_values,
    model_of,
    task_tokens,
)
from opro.program.factory import closed_settings
from opro.search.validation_sizes import confirmation_looks, selection_prompts, split_sizes
from opro.stats import betting
from opro.stats.objectives import COST_FIELD, Objective
from opro.stats.sequential import design_power

if TYPE_CHECKING:
    from llama_index.core.schema import Document

    from opro.probe.sizes import QuestionsNeeded

#: Below this many pairs a measured paired sd is too rough to plan by as it is: its one-sided upper bound at :data:`SD_BOUND_LEVEL`.
SD_BOUND_BELOW = 12
#: 90%, not 80%: the chi-square bound assumes normal differences, and judge differences have heavy tails. In a
#: t(3) world of true sd 0.99 (6 pilot questions measure a median 0.71) the point estimate was below the truth in
#: 76% of pilots, an 80% bound in 46%, a 90% bound in 30%; with normal differences the 90% bound is 1.4-1.8x the
#: truth on 6-11 pairs, which measuring 12 removes (experiments/bench_sd_bound.py).
SD_BOUND_LEVEL = 0.9

#: Paired per-question score difference of two prompts (1-5 judge) when nothing was measured, per ``[judge].paired``:
#: pointwise, bench_selection's judge model's spread (per-call noise 0.9, whole scores), close to the real runs'
#: (docs/benchmarks.md); side by side, that scaled by the sd side by side (one order) over pointwise on the same 40
#: pairs of history_of_alexnet, 0.55 / 0.83 (experiments/judge_side_by_side.py, docs/statistics.md).
DEFAULT_DIFFERENCE_SDS: Mapping[str, float] = {"pointwise": 1.3, "side_by_side": 0.86}
DEFAULT_DIFFERENCE_SD = DEFAULT_DIFFERENCE_SDS["pointwise"]
POWER = 0.8

# Per-call defaults for the embedded models on 2 idle cores (prompt tokens/s, completion tokens/s),
# from the quickstart's measured usage (docs/statistics.md); an endpoint: seconds per call.
_EMBEDDED_SPEED = {"0.5b": (150.0, 18.0), "1.5b": (90.0, 9.0)}
_ENDPOINT_S = 1.5


@dataclass(frozen=True)
class MeasuredNoise:
    """A paired sd measured on ``n`` pairs of this task, and whose it is (for :func:`make_plan`)."""

    sd: float
    n: int
    basis: str


def sd_upper_bound(sd: float, n: int, *, level: float = SD_BOUND_LEVEL) -> float:
    """The one-sided ``level`` upper confidence bound of a standard deviation measured as ``sd`` on ``n``
    values (chi-square, n - 1 degrees of freedom)."""
    from scipy.stats import chi2

    return sd * math.sqrt((n - 1) / float(chi2.ppf(1 - level, n - 1)))


def _planned_sd(noise: MeasuredNoise) -> tuple[float, str]:
    """The sd a plan takes from a measurement: as measured from :data:`SD_BOUND_BELOW` pairs on, else its
    upper bound, said so."""
    if noise.n >= SD_BOUND_BELOW:
        return noise.sd, noise.basis
    bound = sd_upper_bound(noise.sd, noise.n)
    return bound, (f"{noise.basis}; measured {noise.sd:.2f} on {noise.n} pairs, fewer than {SD_BOUND_BELOW}: its "
                   f"one-sided {SD_BOUND_LEVEL:.0%} upper bound")


@dataclass(frozen=True)
class RoleEstimate:
    role: str
    search_calls: float
    validation_calls: float
    validation_calls_max: float
    generation_calls: float
    prompt_tokens_per_call: float
    completion_tokens_per_call: float
    seconds_per_call: float
    #: Where the per-call figures come from.
    basis: str
    cost_usd: float | None = None
    #: The most this role can ask in the run: every candidate, every look and extension question, every
    #: replacement proposal, every generated question (None, in a plan saved before it was kept: see
    #: :func:`check`).
    calls_max: float | None = None

    @property
    def calls(self) -> float:
        return self.search_calls + self.validation_calls + self.generation_calls

    @property
    def tokens(self) -> float:
        return self.calls * (self.prompt_tokens_per_call + self.completion_tokens_per_call)

    @property
    def seconds(self) -> float:
        return self.calls * self.seconds_per_call


@dataclass(frozen=True)
class ChoiceCost:
    """One task answer under one open choice of ``[search.space]`` (the other settings the initial
    configuration's): estimated tokens and its cost (:meth:`opro.program.cost.CostModel.of`)."""

    dimension: str
    value: Value
    prompt_tokens: float
    completion_tokens: float
    cost: float


@dataclass(frozen=True)
class CostPlan:
    """An answer's expected cost per open choice; under the cost objective, what the split sizes confirm."""

    unit: str
    completion_weight: float
    initial: ChoiceCost
    choices: tuple[ChoiceCost, ...]
    objective: Objective
    margin: float
    #: Smallest margin by which a truly equal configuration is confirmed not worse in 80% of runs:
    #: validation stage, and ``opro compare --margin`` on the held-out split (None: never).
    confirmable_margin: float | None = None
    heldout_margin: float | None = None
    #: Shares of the initial configuration's cost per answer the space can save: (dearest, cheapest).
    saving_range: tuple[float, float] | None = None

    def lines(self, *, power: float, alpha: float) -> list[str]:
        def fmt(c: ChoiceCost) -> str:
            cost = amount(c.cost, self.unit) if self.unit != "tokens" else f"weighted {c.cost:,.0f}"
            return f"{c.prompt_tokens + c.completion_tokens:,.0f} tokens ({cost})"

        what = {"usd": "USD", "seconds": "task seconds at each model's seconds per token"}.get(
            self.unit, f"task tokens, completion x{self.completion_weight:g}")
        out = [f"cost per answer (estimated from prompt lengths, {what}): initial configuration {fmt(self.initial)}"]
        dims = dict.fromkeys(c.dimension for c in self.choices)
        for d in dims:
            note = dimension(d).cost_note
            out.append(f"  {d}: " + "; ".join(f"{c.value}: {fmt(c)}" for c in self.choices if c.dimension == d)
                       + (f" ({note})" if note else ""))
        if self.objective.non_inferiority:
            val = ("no margin can be confirmed" if self.confirmable_margin is None
                   else f"{self.confirmable_margin:.2f} points")
            held = ("no margin can be confirmed" if self.heldout_margin is None else f"{self.heldout_margin:.2f} points")
            line = (f"objective {self.objective.name}, margin {self.margin:g}: smallest margin a truly equal configuration is confirmed "
                    f"within at {power:.0%} power, alpha {alpha:g}: validation {val}; held-out compare --margin {held}")
            if self.saving_range is not None:
                lo, hi = self.saving_range
                line += f"; expected saving across the space: {lo:+.0%} (dearest) to {hi:+.0%} (cheapest) per answer"
            out.append(line)
        return out


@dataclass(frozen=True)
class Plan:
    source: str
    split: Mapping[str, int]
    selection_questions: int
    confirmation_questions: int
    #: Questions in no split the confirmation may add as its last look (``validation_extension``): the
    #: most it can ask (a bound), and how many it is expected to have (``looks`` are planned with those).
    extension_questions: int
    looks: tuple[int, ...]
    alpha: float
    difference_sd: float
    sd_basis: str
    #: Smallest true gain the validation stage claims in 80% of runs where the search proposed and
    #: chose it (None: no gain can be claimed); the same for ``opro compare`` on the held-out split.
    detectable: float | None
    heldout_detectable: float | None
    roles: tuple[RoleEstimate, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)
    #: ``[search.space]``'s open dimensions and their choices (empty: only the wording is searched).
    space: Mapping[str, tuple[Value, ...]] = field(default_factory=dict)
    cost: CostPlan | None = None
    #: The configurations step 0 adds to the initial one (:func:`first_moves_of`), as their settings.
    first_moves: tuple[str, ...] = ()
    #: What the plan says beside its figures (why a measured noise was not used).
    notes: tuple[str, ...] = ()
    extension_expected: int = 0
    #: Where the split cannot confirm the claim asked at 80% power, the validation questions that would.
    questions_needed: QuestionsNeeded | None = None
    #: Where questions share source passages: the detectable figures count passages (:class:`Clustering`).
    clustering: Clustering | None = None

    @property
    def calls(self) -> float:
        return sum(r.calls for r in self.roles)

    @property
    def seconds(self) -> float:
        # The embedded models share the CPU, so roles add up; endpoints were divided by their slots.
        return sum(r.seconds for r in self.roles)

    @property
    def cost_usd(self) -> float | None:
        costs = [r.cost_usd for r in self.roles if r.cost_usd is not None]
        return sum(costs) if costs else None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self) | {"calls": self.calls, "seconds": self.seconds, "cost_usd": self.cost_usd}
        if self.cost is not None:  # the objective by its name, as the config gives it
            out[COST_FIELD]["objective"] = self.cost.objective.name
        return out

    def compare_lines(self) -> list[str]:
        """What ``opro compare`` on the held-out split can detect, and its warning if it cannot."""
        n = self.split.get("heldout", 0)
        if self.heldout_detectable is None:
            least = betting.min_pairs(alpha=self.alpha / 2, scale=(SCORE_MIN, SCORE_MAX), planned=max(n, 1)) or n + 1
            return ["warning: `opro compare` " + (f"cannot find a significant difference on {n} held-out questions (its two-"
                    f"sided test needs at least {least} at alpha {self.alpha:g}), so `--promote` cannot pass" if n < least else
                    f"finds no difference significant in {POWER:.0%} of runs on {n} held-out questions: `--promote` rarely passes")]
        return [f"{n} held-out questions: a difference of {self.heldout_detectable:+.2f} points is detected with "
                f"{POWER:.0%} power at alpha {self.alpha:g} (paired score sd {self.difference_sd:.2f}: {self.sd_basis})"]

    def lines(self) -> list[str]:
        """The plan as a few lines of text."""
        s = self.split
        det = "no gain can be claimed" if self.detectable is None else f"{self.detectable:+.2f} points"
        held = ("no difference can be significant" if self.heldout_detectable is None
                else f"{self.heldout_detectable:+.2f} points")
        out = [
            f"plan for {self.source}: split {s.get('exemplar', 0)} exemplar / {s.get('optimization', 0)} optimization / "
            f"{s.get('validation', 0)} validation / {s.get('heldout', 0)} held-out",
            f"detectable at {POWER:.0%} power, alpha {self.alpha:g} (paired score sd {self.difference_sd:.2f}: "
            f"{self.sd_basis}" + ("" if self.clustering is None else f"; {self.clustering.line()}")
            + f"): validation {det} ({self.selection_questions} selection + "
            f"{self.confirmation_questions} confirmation questions"
            + (f" + up to {self.extension_questions} extension questions" if self.extension_questions else "")
            + (f" (about {self.extension_expected} expected)"
               if self.extension_questions > self.extension_expected else "")
            + f", looks at {', '.join(map(str, self.looks)) or '-'}); "
            f"held-out compare {held}",
            *(f"noise: {n}" for n in self.notes),
        ]
        if self.space:
            notes = [n for k in self.space if (n := dimension(k).plan_note)]
            out.append("search space: the wording, and " + "; ".join(f"{k} {list(v)}" for k, v in self.space.items())
                       + "".join(f" ({n})" for n in notes))
            if self.first_moves:
                out.append(f"first moves (step 0, the initial instruction with): {'; '.join(self.first_moves)}")
        if self.cost is not None and (self.space or self.cost.objective.non_inferiority):
            out += self.cost.lines(power=POWER, alpha=self.alpha)
        for r in self.roles:
            if not r.calls:
                continue
            parts = [f"search {r.search_calls:.0f}"] if r.search_calls else []
            if r.validation_calls_max:
                parts.append(f"validation {r.validation_calls:.0f} (at most {r.validation_calls_max:.0f})")
            if r.generation_calls:
                parts.append(f"dataset {r.generation_calls:.0f}")
            cost = "" if r.cost_usd is None else f", ${r.cost_usd:.2f}"
            out.append(f"  {r.role}: {_planned(r.calls, r.calls_max or r.calls)} calls ({', '.join(parts)}), "
                       f"{r.tokens:,.0f} tokens, {_duration(r.seconds)}{cost} [{r.basis}]")
        cost = "" if self.cost_usd is None else f", ${self.cost_usd:.2f}"
        most = sum(r.calls_max or r.calls for r in self.roles)
        out.append(f"total: {_planned(self.calls, most)} calls, {sum(r.tokens for r in self.roles):,.0f} tokens, "
                   f"about {_duration(self.seconds)}{cost} (a warm call cache makes a rerun free)")
        out += [f"warning: {w}" for w in self.warnings]
        return out


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _difference_sd(config: OproConfig, *, pilot_noise: MeasuredNoise | None = None,
                   digest: str | None = None) -> tuple[float, str, str]:
    """The paired per-question score difference's sd, whose it is, and why the last run's is not used
    (empty: it is, or there is none): measured on the last run's confirmation pairs (what the test sees)
    where its ``summary.json`` records this task's noise digest (``digest``), else ``pilot_noise`` (``opro
    probe``'s pilot on this task; :func:`opro.probe.store.pilot_noise`), else from the judge's
    calibration (a lower bound), else the default. A measurement on fewer than :data:`SD_BOUND_BELOW` pairs
    is taken at its upper bound (:func:`sd_upper_bound`)."""
    from opro.calibration.calibrate import judge_signature, load_calibration
    from opro.errors import DataError

    measured, unused = _last_run_noise(_last_summary(config), digest=digest)
    if measured is not None:
        return (*_planned_sd(measured), "")
    if pilot_noise is not None:
        return (*_planned_sd(pilot_noise), unused)
    try:
        report = load_calibration(config.output_dir)
    except DataError:
        report = None
    if report is not None and report.retest and report.retest.sd and (
            not report.signature or report.signature == judge_signature(config)):
        # Two prompts' scores differ by the judge's noise on each (and by how the prompts differ: a lower bound).
        return math.sqrt(2) * report.retest.sd, "opro judge calibrate's test-retest noise (a lower bound)", unused
    return DEFAULT_DIFFERENCE_SDS[config.judge.paired], (f"default ({config.judge.paired.replace('_', ' ')}): not measured; "
                                   "`opro probe` measures it (`opro judge calibrate` with --retest, a lower bound)"), unused


def _last_run_noise(summary: Mapping[str, Any] | None, *, digest: str | None) -> tuple[MeasuredNoise | None, str]:
    """The paired noise of the last run's validation stage, or None and why it is not used (empty: there
    is none to use): only a summary that records this task's noise digest measured this task."""
    v = (summary or {}).get("validation") or {}
    chosen = next((f for f in v.get("finalists", []) if f.get("chosen")), None)
    pairs = [(a, b) for a, b in zip((chosen or {}).get("scores", []), v.get("initial_scores", []), strict=False)
             if a is not None and b is not None]
    if len(pairs) < 5 or statistics.stdev(a - b for a, b in pairs) <= 0:
        return None, ""
    recorded = (summary or {}).get("noise_digest")
    if recorded is None or digest is None or recorded != digest:
        why = ("it records no noise digest (an older opro), so the data it measured is unknown" if recorded is None
               else "this config's dataset is not prepared yet, so its data cannot be matched" if digest is None
               else "it was measured on another dataset, split, judge or task model")
        return None, f"the last run's validation noise ({len(pairs)} pairs in summary.json) is not used: {why}"
    return MeasuredNoise(statistics.stdev(a - b for a, b in pairs), len(pairs),
                         f"the last run's validation stage ({len(pairs)} pairs)"), ""


def _last_summary(config: OproConfig) -> dict[str, Any] | None:
    path = RunDir(config.output_dir).summary
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


#: Share of the generated questions kept (the rest are unusable or near-duplicates) and answered:
#: 19 of 24 on the quickstart.
_KEPT = 0.8


def _chunks_to_generate(config: OproConfig, documents: Callable[[], Sequence[Document]] | None) -> int:
    """Chunks a dataset generated from the corpus asks questions of; 0 with a dataset (given or made)."""
    d = config.data
    if d.dataset or RunDir(config.output_dir).has_dataset() or documents is None:
        return 0
    from opro.data.generation import select_chunks
    from opro.program.retrieval import chunk_documents

    chunks = chunk_documents(documents(), chunk_size=config.rag.chunk_size, chunk_overlap=config.rag.chunk_overlap)
    return len(select_chunks(chunks, max_chunks=d.max_chunks or None))


def _generation_calls(config: OproConfig, chunks: int) -> float:
    """Generator calls for a dataset generated from ``chunks`` chunks: one per chunk for its questions
    and one per kept question for its answer."""
    return chunks * (1 + _KEPT * config.data.questions_per_chunk)


def _unused_questions(config: OproConfig, chunks: int) -> tuple[int, int]:
    """Questions in no split, which a validation may extend into, as expected and at most: counted in the
    run's dataset once it is split; before that, expected from the given dataset's size or from the
    chunks still to be generated (the share of generated questions usually kept) less the split sizes.
    At most, before the split: every question but the validation split's (a split that comes out
    smaller than asked, as groups of related questions are kept whole, leaves the rest unused; a
    validation split that shrinks confirms on fewer questions by as many), of as many questions as the
    dataset has, or as the generator can keep (``questions_per_chunk`` of every chunk)."""
    from opro.data.dataset import load_dataset
    from opro.errors import OproError

    s = config.data.split
    placed = s.exemplar + s.optimization + s.validation + s.heldout
    run = RunDir(config.output_dir)
    try:
        if run.has_dataset():
            made = load_dataset(run.dataset)
            if made.split is not None:  # its unused questions, then the dataset's pool (opro dataset pool)
                return (n := extendable(config, made)), n
            return max(0, len(made) - placed), max(0, len(made) - s.validation)
        if config.data.dataset:
            n = len(load_dataset(config.data.dataset))
            return max(0, n - placed), max(0, n - s.validation)
    except (OproError, OSError):  # the run itself says what is wrong with the dataset
        return 0, 0
    generated = chunks * config.data.questions_per_chunk
    return max(0, int(generated * _KEPT) - placed), max(0, generated - s.validation)


def _per_call(config: OproConfig, role: str, last: Mapping[str, Any] | None,
              rates: Mapping[str, MeasuredRate]) -> tuple[float, float, float, str]:
    """(prompt tokens, completion tokens, seconds) per call of ``role``, and where they come from: the
    last run in this output folder (this role's own calls), else the tokens estimated and the seconds at
    the speed its model measured on this machine (:mod:`opro.llm.rates`), else defaults."""
    measured = ((last or {}).get("usage") or {}).get(role) or {}
    if measured.get("calls", 0) >= 3:
        n = measured["calls"]
        return (measured["prompt_tokens"] / n, measured["completion_tokens"] / n, measured["wall_s"] / n,
                f"measured: the last run's {n} calls")
    rag, spec, space = config.rag, getattr(config.models, role), config.search.space.dimensions

    def mean(d: Dimension) -> Any:
        # The sampler spreads the candidates over an open dimension's choices: their mean, else the config's.
        initial = d.initial(config)
        if not d.numeric or initial is None:
            return initial
        return statistics.fmean(float(v) for v in space[d.name]) if space.get(d.name) else float(initial)

    prompt, completion = {
        "task": task_tokens(config, {d.name: mean(d) for d in DIMENSIONS}),
        "judge": (450.0, 0.0 if config.judge.score_from != "reply" else 12.0),
        "optimizer": (250 + 25 * min(config.optimizer.max_history, 6) + 40 * config.optimizer.exemplars, 75.0),
        "generator": (80 + 0.8 * rag.chunk_size, 20.0 * config.data.questions_per_chunk + 15),
    }[role]
    specs = dict(in_play(config)) if role == "task" else {role: spec}
    if len(specs) == 1:
        return (prompt, completion, *_call_seconds(spec, prompt, completion, rates))
    # Several task models answer (the sampler spreads the candidates over them): their mean, each one's said.
    per = {name: _call_seconds(s, prompt, completion, rates) for name, s in specs.items()}
    return (prompt, completion, statistics.fmean(t for t, _ in per.values()),
            "; ".join(f"{name}: {t:.1f} s ({said})" for name, (t, said) in per.items()))


def _call_seconds(spec: ModelSpec, prompt: float, completion: float,
                  rates: Mapping[str, MeasuredRate]) -> tuple[float, str]:
    """Seconds of one call of ``spec``'s model with these tokens, and where they come from."""
    if spec.backend == "scripted":
        return 0.0, "scripted: no time"
    here = rates.get(rate_key(spec.backend, spec.model))
    when = "" if here is None else f"{here.calls} calls on {here.measured[:10]}"
    if spec.backend == "openai":
        slots = spec.max_concurrency or 4
        if here is not None:
            return here.latency / slots, f"measured here: {here.latency:.1f} s per call ({when}) over {slots} slots"
        return _ENDPOINT_S / slots, f"assumed {_ENDPOINT_S:g} s per call over {slots} slots"
    size = "0.5b" if "0.5b" in spec.model.lower() else "1.5b"
    prefill, decode = _EMBEDDED_SPEED[size]
    if here is not None:
        # The default's shape (prefill against decode), at the speed this model measured on this machine.
        return (here.seconds_per_call(prompt, completion, prefill=prefill, decode=decode),
                f"measured here: {when}, {here.factor(prefill=prefill, decode=decode):.1f}x the idle default")
    return (prompt / prefill + completion / decode,
            f"default for a {size.upper()} embedded model on 2 idle cores; nothing measured here yet")


def first_moves_of(config: OproConfig) -> list[dict[str, Value]]:
    """The configurations the search adds to step 0 under ``config`` (what :class:`SearchSpace` gives
    with :func:`answer_cost` as its price)."""
    from opro.search.space import first_moves, space_choices

    initial = initial_values(config)
    choices = space_choices(config.search.space.dimensions, initial)
    if not choices:
        return []
    return first_moves(choices, {k: dimension(k).coerce(initial[k]) for k in choices},
                       price=lambda values: answer_cost(config, values), objective=claim(config.optimizer).objective)


def _cost_plan(config: OproConfig, *, sd: float, sizes: Sequence[int], heldout: tuple[int, float]) -> CostPlan:
    model, design = config.cost_model(), validation_settings(config.optimizer)
    rule = design.claim
    initial = initial_values(config)

    def at(values: Mapping[str, Any], dimension: str = "initial", value: Value = 0) -> ChoiceCost:
        prompt, completion = task_tokens(config, values)
        return ChoiceCost(dimension, value, prompt, completion,
                          model.of(prompt_tokens=prompt, completion_tokens=completion, model=model_of(values.get)))

    space = config.search.space.dimensions
    base = at(initial)
    choices = tuple(at({**initial, d: v}, d, v) for d, values in space.items()
                    for v in sorted({*values, dimension(d).coerce(initial[d])}))  # type: ignore[type-var]
    confirmable = held = None
    saving = None
    if rule.objective.non_inferiority:
        if sizes:
            # Non-inferiority is the same test on differences shifted by the margin: a truly equal
            # configuration is confirmed at the margin that equals the smallest detectable gain.
            confirmable = design_power(sizes, alpha=rule.alpha, sd=sd, scale=(SCORE_MIN, SCORE_MAX),
                                       futility=design.futility, power=POWER,
                                       futility_confidence=rule.futility_confidence).detectable
        held = heldout_detectable(heldout[0], alpha=rule.alpha, sd=heldout[1], scale=(SCORE_MIN, SCORE_MAX),
                                  sides=1, power=POWER)
        if space and base.cost > 0:
            # Every setting lengthens the prompt or the answer, so the extremes are the cheapest and
            # the dearest choices of each dimension together.
            ends = [at({**initial, **{d: f(set(v) | {initial[d]}) for d, v in space.items()  # type: ignore[type-var]
                                      if dimension(d).numeric}}).cost for f in (max, min)]
            saving = (1 - ends[0] / base.cost, 1 - ends[1] / base.cost)
    return CostPlan(unit=model.unit, completion_weight=model.completion_weight, initial=base, choices=choices, objective=rule.objective, margin=rule.margin,
                    confirmable_margin=confirmable, heldout_margin=held, saving_range=saving)


def _judge_calls_per_answer(config: OproConfig) -> float:
    """Judge calls per validation answer: its pointwise score, and under the side-by-side judge its share of
    its pair's calls (one per order shown, two where the scores are read from logits: one per answer)."""
    if config.judge.paired != "side_by_side":
        return 1.0
    orders = 2 if config.judge.both_orders else 1
    # "auto" reads logits where the backend gives them: llama.cpp's (remote chat APIs do not).
    logits = config.judge.score_from == "logits" or (
        config.judge.score_from == "auto" and config.models.judge.backend == "llamacpp")
    return 1.0 + orders * (2 if logits else 1) / 2


def _roles(config: OproConfig, *, chunks: int, moves: int, validation: float,
           validation_max: float) -> list[RoleEstimate]:
    """Calls per role, with tokens, time and cost: the search's (its maximum: nothing pruned; the
    optimizer's as usually asked, its replacements for rejected proposals in the most; ``moves``: the
    first moves step 0 adds to the initial instructions), the validation's (expected and most) and the
    dataset generation's (expected and most), and the most in all."""
    o, s = config.optimizer, config.data.split
    candidates = len(config.rag.initial_instructions) + moves + o.steps * o.candidates_per_step
    scored = candidates * s.optimization
    extra = {"random": 0, "failures": o.steps * o.exemplars, "hardest": (o.steps + 1) * s.exemplar}[o.exemplar_strategy]
    space = config.search.space
    if "demos" in space.dimensions and space.demo_source == "bootstrapped":
        extra += s.exemplar  # the exemplar questions answered and judged once, for the demonstration pool
    k = o.steps * o.candidates_per_step
    generated = chunks * config.data.questions_per_chunk  # the most the generator keeps, each answered once
    judged = _judge_calls_per_answer(config)
    # (search, its most, validation, its most, generation, its most)
    calls = {
        "task": (scored + extra, scored + extra, validation, validation_max, 0.0, 0.0),
        "judge": (scored + extra, scored + extra, validation * judged, validation_max * judged, 0.0, 0.0),
        # Between k and 3k samples a step (rejected proposals are replaced); about 1.5k in practice.
        "optimizer": (1.5 * k, 3.0 * k, 0.0, 0.0, 0.0, 0.0),
        "generator": (0.0, 0.0, 0.0, 0.0, _generation_calls(config, chunks), float(chunks + generated)),
    }
    last = _last_summary(config)
    rates = load_rates(rates_path(config.call_cache_path))
    roles = []
    for role, (search, search_max, v, vmax, gen, gen_max) in calls.items():
        prompt, completion, seconds, basis = _per_call(config, role, last, rates)
        price = config.prices().get(getattr(config.models, role).model)
        n = search + v + gen
        cost = None if price is None else n * (prompt * price.prompt + completion * price.completion) / 1e6
        roles.append(RoleEstimate(role=role, search_calls=search, validation_calls=v, validation_calls_max=vmax,
                                  generation_calls=gen, prompt_tokens_per_call=prompt,
                                  completion_tokens_per_call=completion, seconds_per_call=seconds, basis=basis,
                                  cost_usd=cost, calls_max=search_max + max(v, vmax) + max(gen, gen_max)))
    return roles


def make_plan(config: OproConfig, *, documents: Callable[[], Sequence[Document]] | None = None,
              pilot_noise: MeasuredNoise | None = None, noise_digest: str | None = None) -> Plan:
    """The plan of ``opro optimize`` for ``config`` (reads the output folder; makes no LLM call).
    ``documents``: the corpus, read only when the dataset is still to be generated from it (one
    generator call per chunk); without it that count is left out. ``pilot_noise``: the paired sd a
    probe measured on this task (:func:`opro.probe.store.pilot_noise`), planned by where no run
    measured one. ``noise_digest``: this config's (:meth:`opro.experiment.Experiment.noise_digest`): the
    last run's noise is used only where its summary records the same (None: it is not used)."""
    o, s = config.optimizer, config.data.split
    design = validation_settings(o)
    rule = design.claim
    sd, sd_basis, noise_note = _difference_sd(config, pilot_noise=pilot_noise, digest=noise_digest)
    warnings: list[str] = []
    validating = o.finalists > 0 and s.validation > 0
    finalists = min(o.finalists, 1 + o.steps * o.candidates_per_step)
    n_sel, n_conf = split_sizes(design, s.validation, finalists) if validating else (0, 0)
    chunks = _chunks_to_generate(config, documents)
    unused, unused_max = _unused_questions(config, chunks) if validating and o.validation_extension else (0, 0)
    # Planned at the expected extension; what the run can ask, at the most it can extend into.
    sizes, sizes_max = confirmation_looks(design, n_conf, unused), confirmation_looks(design, n_conf, unused_max)
    detectable, asked = None, 0.0
    clus = clustering(config) if validating or s.heldout else None  # the tests count source passages
    units, vsd = clus.scaled("validation", sizes, sd) if clus else (list(sizes), sd)
    if sizes:
        p = design_power(units, alpha=rule.alpha, sd=vsd, scale=(SCORE_MIN, SCORE_MAX), futility=design.futility,
                         power=POWER)
        detectable, asked = p.detectable, p.questions_null * (clus.size("validation") if clus else 1.0)
        # The fewest pairs with which even the widest possible gains reach a claim (alpha, scale, margin).
        least = betting.min_pairs(alpha=rule.alpha, scale=(SCORE_MIN, SCORE_MAX), planned=units[-1],
                                  above=-rule.objective.shift(rule.margin)) or units[-1] + 1
        if units[-1] < least:
            warnings.append(f"the validation stage cannot claim a gain: on {sizes[-1]} confirmation questions"
                            + (f" ({units[-1]} source passages)" if clus else "") + f" no sample of 1-5 scores reaches alpha "
                            f"{rule.alpha:g}; give [data.split].validation at least {round(least * (clus.size('validation') if clus else 1)) + n_sel} (better: enough for the gain you look for)")
    elif validating is False and o.finalists == 0:
        warnings.append("no validation stage ([optimizer].finalists = 0): the returned score is in-sample and no gain is claimed")
    (held_n,), held_sd = clus.scaled("heldout", [s.heldout], sd) if clus and s.heldout else ([s.heldout], sd)
    held = heldout_detectable(held_n, alpha=rule.alpha, sd=held_sd, scale=(SCORE_MIN, SCORE_MAX), sides=2, power=POWER)

    moves = first_moves_of(config)
    choosing = selection_prompts(design, finalists) * n_sel
    roles = _roles(config, chunks=chunks, moves=len(moves),
                   validation=(choosing + 2.0 * asked) if sizes else 0.0,
                   validation_max=(choosing + 2.0 * sizes_max[-1]) if sizes_max else 0.0)
    made = Plan(source=str(config.source), split=asdict(s), selection_questions=n_sel, confirmation_questions=n_conf,
                extension_questions=(sizes_max[-1] - n_conf) if sizes_max else 0,
                extension_expected=(sizes[-1] - n_conf) if sizes else 0, looks=tuple(sizes), alpha=rule.alpha,
                difference_sd=sd, sd_basis=sd_basis, detectable=detectable, heldout_detectable=held,
                roles=tuple(roles), warnings=tuple(warnings), space=config.search.space.dimensions,
                cost=_cost_plan(config, sd=vsd, sizes=units, heldout=(held_n, held_sd)), clustering=clus,
                notes=(noise_note,) if noise_note else (),
                first_moves=tuple(settings_text(changed(m, initial_values(config))) for m in moves))
    c = made.cost
    if c is not None and c.objective.non_inferiority and (c.confirmable_margin is None or c.confirmable_margin > rule.margin):
        can = "no margin" if c.confirmable_margin is None else f"only a margin of {c.confirmable_margin:.2f} or more"
        made = replace(made, warnings=(*made.warnings, (
            f"[optimizer].margin {rule.margin:g}: the validation stage confirms {can} for a truly equal, cheaper "
            f"configuration in {POWER:.0%} of runs; raise [data.split].validation or the margin")))
    if sizes and (need := needed_for(design, selection=n_sel, confirmation=n_conf, unused=unused, sd=sd, power=POWER, clusters=clus,
                                     scale=(SCORE_MIN, SCORE_MAX), confirms=c.confirmable_margin if rule.objective.non_inferiority and c
                                     else detectable)) is not None:
        made = replace(made, questions_needed=need, warnings=(*made.warnings, need.text(pool_command=pool_command(config))))
    if config.program.factory:  # the user's engine: the settings its factory takes open; the others stay closed
        made = replace(made, warnings=(*made.warnings, closed_settings(factory=config.program.factory, base_dir=config.base_dir)))
    if held is None:
        return replace(made, warnings=(*made.warnings, made.compare_lines()[0].removeprefix("warning: ")))
    return made


def check(plan: Mapping[str, Any], usage: Mapping[str, Mapping[str, Any]], *, wall_s: float) -> list[str]:
    """The plan (:meth:`Plan.as_dict`, as saved before the run) beside the run's usage: calls per
    role (made + cache hits, since the plan counts requests) and wall time, with the difference.
    Where the validation may ask more than it is expected to (its later looks, the extension), the
    most it may ask is shown too, and a run within it is said to be so: a validation that went to its
    last look is the plan kept, not missed."""
    out = []
    total_est = total = total_most = 0.0
    for r in plan.get("roles", []):
        u = usage.get(r["role"]) or {}
        est = r["search_calls"] + r["validation_calls"] + r["generation_calls"]
        # A plan saved before it kept the most a role can ask: its validation's most only.
        most = r.get("calls_max") or est - r["validation_calls"] + max(r["validation_calls"],
                                                                        r.get("validation_calls_max") or 0.0)
        got = float(u.get("calls", 0) + u.get("cache_hits", 0))
        total_est, total, total_most = total_est + est, total + got, total_most + most
        if est or got:
            out.append(f"  {r['role']}: planned {_planned(est, most)} calls, made {got:.0f} ({_rel(got, est, most)})")
    planned_s = float(plan.get("seconds", 0.0))
    calls = f"{_planned(total_est, total_most)} calls planned, {total:.0f} made ({_rel(total, total_est, total_most)})"
    out.insert(0, f"plan vs run: {calls}; {_duration(planned_s)} planned, {_duration(wall_s)} taken ({_rel(wall_s, planned_s)})")
    return out


def _planned(est: float, most: float) -> str:
    return f"{est:.0f}" if most <= est else f"{est:.0f} (at most {most:.0f})"


def _rel(got: float, est: float, most: float = 0.0) -> str:
    if not est:
        return "n/a" if got else "as planned"
    within = "; within the most planned" if est < got <= most else ""
    return f"{(got - est) / est:+.0%}{within}"


__all__ = ["DEFAULT_DIFFERENCE_SD", "DEFAULT_DIFFERENCE_SDS", "SD_BOUND_BELOW", "SD_BOUND_LEVEL", "ChoiceCost", "CostPlan", "MeasuredNoise", "Plan",
           "RoleEstimate", "answer_cost", "check", "first_moves_of", "make_plan", "sd_upper_bound"]
