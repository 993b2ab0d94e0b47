"""The search space beside the wording: demonstrations and retrieval / generation settings.

A candidate is a whole configuration: an instruction, proposed by the optimizer LLM, and a value of
each open dimension (``[search.space]``), proposed by Optuna's sampler (TPE, seeded) from the scores
of the candidates before it. The values are drawn once, when worker 0 proposes the step, and stored
with the step's proposals, so every worker and every rerun evaluates the same configurations; each
candidate's trial carries them as Optuna parameters (the dashboard and ``trials_dataframe`` show
them) and the validation stage decides between whole configurations. A candidate is named by its
configuration (:mod:`opro.program.configurations`): the initial instruction with other settings is
another candidate.

Before the sampler takes over, step 0 evaluates the initial instruction with the *first moves*
(:func:`first_moves`): each open dimension alone at the choice the plan prices lowest (the cost
objective) or highest (quality: :meth:`opro.stats.objectives.Objective.first_move`), and all of them
together, so that no direction the objective looks for is left to the sampler's luck.

Demonstrations come from the exemplar split only (never optimization, validation or held-out
questions): its reference answers, or the task model's own answers that the judge passed (DSPy's
BootstrapFewShot). ``demos = k`` shows the first k of that pool, each in the template's own fields.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from opro.errors import ConfigError
from opro.judges.withheld import NOT_IN_CONTEXT
from opro.program.configurations import Configuration, changed, settings_text
from opro.program.dimensions import DIMENSIONS as TABLE
from opro.program.dimensions import SETTINGS, Value, dimension
from opro.program.prompts import Demo, QATemplate
from opro.search.results import CandidateRecord
from opro.stats.objectives import Objective, as_objective

logger = logging.getLogger(__name__)

#: A configuration's values beside the wording, by dimension.
Params = Mapping[str, Value]
#: The dimensions' names, in the table's order (:data:`opro.program.dimensions.DIMENSIONS`).
DIMENSIONS = tuple(d.name for d in TABLE)
#: What one answer costs under a configuration (the values of every open dimension): the plan's
#: estimate (:func:`opro.program.dimensions.answer_cost`), in the cost objective's unit.
Price = Callable[[Params], float]


def space_choices(dimensions: Mapping[str, Sequence[Value]], initial: Mapping[str, Value | None]) -> dict[str, tuple[Value, ...]]:
    """Each open dimension's choices, the initial configuration's value among them (it is a point of
    the space), sorted; a dimension with no values is not open."""
    out: dict[str, tuple[Value, ...]] = {}
    for d in TABLE:
        values = dimensions.get(d.name)
        if values:
            out[d.name] = tuple(sorted({*values, d.coerce(initial[d.name])}))  # type: ignore[type-var]
    return out


def first_moves(choices: Mapping[str, Sequence[Value]], initial: Mapping[str, Value], *, price: Price,
                objective: Objective | str) -> list[dict[str, Value]]:
    """The configurations step 0 evaluates with the initial instruction, before the sampler: each open
    dimension alone at the choice whose ``price`` the objective's :meth:`~opro.stats.objectives.Objective.first_move`
    ranks first (the cost objective: its cheapest, what it looks for; quality: its dearest, since the
    plan knows what a choice costs, not what it is worth, and the moves that give the model more to
    work with, more context, more demonstrations, room to answer, are the ones a quality search tries
    first), then all of those together. A
    dimension none of whose choices ranks strictly before the initial value (the
    retriever kind: the same tokens) has no such move. Deterministic: the same moves on every worker
    and rerun, in the table's order."""
    key = as_objective(objective).first_move
    moves: dict[str, Value] = {}
    for name, values in choices.items():
        priced = [(key(price({**initial, name: v})), i, v) for i, v in enumerate(values)]
        best = min(priced)
        if best[0] < key(price(dict(initial))) - 1e-9:
            moves[name] = best[2]
    out = [{**initial, name: v} for name, v in moves.items()]
    if len(moves) > 1:
        out.append({**initial, **moves})
    return out


def _demo_context(texts: Sequence[str], chars: int) -> str:
    return " ".join(" ".join(texts).split())[:chars]


def reference_demos(examples: Sequence[Any], *, retrieve: Callable[[str], Sequence[str]], chars: int) -> tuple[Demo, ...]:
    """Demonstrations from exemplar questions with a reference answer: the question, its reference
    context (else what the retriever finds for it) cut to ``chars``, and its reference answer. A
    question the corpus cannot answer (:data:`opro.judges.withheld.NOT_IN_CONTEXT`) shows what the retriever
    finds, as the model will see it."""
    out = []
    for e in examples:
        withheld = str(e.reference_answer or "").strip() == NOT_IN_CONTEXT
        context = _demo_context((not withheld and e.reference_contexts[:1]) or retrieve(e.query), chars)
        answer = str(e.reference_answer or "").strip()
        if context and answer:
            out.append(Demo(query=e.query, context=context, answer=answer))
    return tuple(out)


def bootstrapped_demos(examples: Sequence[Any], *, answer: Callable[[Any], Any], chars: int) -> tuple[Demo, ...]:
    """Demonstrations from the task model's own answers to exemplar questions that the judge passed
    (``answer(example)`` gives the judged row: its answer, contexts and verdict), as DSPy's
    BootstrapFewShot keeps the traces its metric accepts."""
    out = []
    for e in examples:
        row = answer(e)
        if row is None or not row.passing or not row.answer.strip():
            continue
        context = _demo_context(row.contexts, chars)
        if context:
            out.append(Demo(query=e.query, context=context, answer=row.answer.strip()))
    return tuple(out)


class SearchSpace:
    """The open dimensions, their choices, the initial configuration's values and the demo pool."""

    def __init__(
        self,
        *,
        dimensions: Mapping[str, Sequence[Value]],
        initial: Mapping[str, Value | None],
        demos: Sequence[Demo] = (),
        sampler: str = "tpe",
        seed: int = 0,
        demo_source: str = "references",
        objective: Objective | str = "quality",
        price: Price | None = None,
    ) -> None:
        unknown = sorted(set(dimensions) - set(DIMENSIONS))
        if unknown:
            raise ConfigError(f"[search.space] has no dimension {unknown[0]!r}; open: {', '.join(DIMENSIONS)}")
        # The initial configuration is a point of the space: its value is always a choice.
        self.choices: dict[str, tuple[Value, ...]] = space_choices(dimensions, initial)
        self.initial: dict[str, Value] = {name: dimension(name).coerce(initial[name]) for name in self.choices}
        #: What an answer costs under a configuration (None: no first moves).
        self.price = price
        self.demos = tuple(demos)
        self.sampler = sampler
        self.seed = seed
        self.demo_source = demo_source
        #: What the sampler's study optimizes (:attr:`~opro.stats.objectives.Objective.directions`): under
        #: the cost objective two values (maximize the score, minimize the cost per answer), so it proposes
        #: values from the quality-cost front, not from the score alone.
        self.objective = as_objective(objective)
        most = max(int(v) for v in self.choices.get("demos", (0,)))
        if most > len(self.demos):
            raise ConfigError(
                f"[search.space].demos asks for up to {most} demonstrations, but the exemplar "
                f"split gives {len(self.demos)} ({demo_source}): raise [data.split].exemplar or lower the demos"
            )

    @property
    def open(self) -> bool:
        return bool(self.choices)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {name: optuna.distributions.CategoricalDistribution(values) for name, values in self.choices.items()}

    def describe(self) -> dict[str, Any]:
        """What a score depends on (the study's fingerprint): the choices, the sampler and the demos;
        and the first moves step 0 evaluates (also there when none: a study from before candidates
        were named by their configuration keyed them by their instruction, and is another study)."""
        pool = json.dumps([d.to_json() for d in self.demos], sort_keys=True)
        return {"choices": {k: list(v) for k, v in self.choices.items()}, "sampler": self.sampler,
                "demo_source": self.demo_source, "demos_sha256": hashlib.sha256(pool.encode()).hexdigest()[:16],
                "first": [settings_text(changed(m, self.initial)) for m in self.first_moves()]}

    def first_moves(self) -> list[dict[str, Value]]:
        """The configurations step 0 adds to the initial one (:func:`first_moves`); none without a price."""
        if self.price is None or not self.open:
            return []
        return first_moves(self.choices, self.initial, price=self.price, objective=self.objective)

    def name(self, instruction: str, params: Params) -> str:
        """A candidate's name: ``instruction``, and in braces the values of ``params`` that differ from
        the initial configuration's (:meth:`opro.program.configurations.Configuration.name`)."""
        values = {k: dimension(k).coerce(v) for k, v in params.items() if k in self.choices}
        return Configuration(instruction, {**self.initial, **values}).name(self.initial)

    def _make_sampler(self, step: int) -> optuna.samplers.BaseSampler:
        if self.sampler == "random":
            return optuna.samplers.RandomSampler(seed=self.seed + step)
        # Few candidates: TPE starts modelling after a handful, and constant_liar spreads one step's picks.
        return optuna.samplers.TPESampler(seed=self.seed + step, n_startup_trials=4, constant_liar=True)

    def sample(self, history: Sequence[CandidateRecord], k: int, *, step: int) -> list[dict[str, Value]]:
        """Values for ``k`` new candidates of ``step``, drawn by the sampler from the scored history."""
        if not self.open or k <= 0:
            return [{} for _ in range(max(0, k))]
        dists = self.distributions()
        sampling = optuna.create_study(directions=list(self.objective.directions), sampler=self._make_sampler(step))
        for r in history:
            params = {n: r.params.get(n) for n in dists}
            if r.status != "complete" or r.score is None or any(v not in self.choices[n] for n, v in params.items()):
                continue
            values = self.objective.values(float(r.score), r.cost)
            if values is None:
                continue
            sampling.add_trial(optuna.trial.create_trial(params=params, distributions=dists, values=values))
        # Asked trials stay running: TPE's constant liar counts them, so one step's picks spread out.
        return [{n: dimension(n).coerce(v) for n, v in sampling.ask(dists).params.items()} for _ in range(k)]

    def configure(self, template: QATemplate, params: Params) -> QATemplate:
        """``template`` with these values (the initial configuration's for a dimension not given)."""
        values = {**self.initial, **{k: dimension(k).coerce(v) for k, v in params.items() if k in self.choices}}
        out = template
        for d in TABLE:  # the template's own content (the demonstrations: the first k of the pool)
            if not d.is_setting and d.name in values:
                out = d.configure(out, values[d.name], self.demos)
        if any(k in values for k in SETTINGS):
            out = out.with_settings(**{k: values.get(k, template.setting(k)) for k in SETTINGS})
        return out


__all__ = ["DIMENSIONS", "Objective", "Params", "Price", "SearchSpace", "bootstrapped_demos", "first_moves",
           "reference_demos", "space_choices"]
