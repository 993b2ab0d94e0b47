"""The task models a config can answer with, by name, and what each one's tokens cost.

``[models.task]`` is named ``task``; each ``[models.task_choices.NAME]`` table is a full model table
named NAME; the embedded models are there by name with no table (:data:`BUILTIN_TASK_MODELS`: ``0.5b``
and ``1.5b``; a table of the same name replaces one). ``[search.space].task_model`` chooses among them
(:mod:`opro.program.dimensions`). The initial configuration's model is ``[models.task]``: it is named
by the first of the searched, declared and embedded names whose table is the same, else ``task``, so
the default config's ``task_model = ["0.5b", "1.5b"]`` is two choices, the 0.5B the initial one.

Where several models are in play, :func:`task_cost_model` prices each answer by the model that gave
it (:class:`opro.program.cost.CostModel`): in USD where every one has prices, else in seconds at each
one's measured rates (:mod:`opro.llm.speed`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from opro.errors import ConfigError
from opro.llm.client import LLM, Price
from opro.llm.packs import EMBEDDED_MODELS, EMBEDDED_STRONG_MODEL, EMBEDDED_TASK_MODEL
from opro.llm.pool import ModelSpec
from opro.llm.rates import rate_key
from opro.llm.speed import (
    TokenRate,
    calibrate,
    default_rate,
    load_token_rates,
    save_token_rates,
    speed_path,
    together,
)
from opro.paths import RunDir
from opro.program.cost import CostModel, ModelCost
from opro.program.dimensions import DIMENSIONS, NAME_PATTERN, Value, unknown_model

#: ``[models.task]``'s own name.
INITIAL = "task"
#: The embedded task models available by name with no table.
BUILTIN_TASK_MODELS: Mapping[str, str] = MappingProxyType({"0.5b": EMBEDDED_TASK_MODEL, "1.5b": EMBEDDED_STRONG_MODEL})


def check_name(name: str, *, where: str) -> str:
    """``name`` if a task model may be called so; a :class:`ConfigError` naming ``where`` otherwise."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: {name!r} cannot name a task model: use letters, digits, '.', '_' and '-' "
                          "(it is written in a configuration's name, {task_model=NAME})")
    if name == INITIAL:
        raise ConfigError(f"{where}: {INITIAL!r} is [models.task]'s own name; give the table another name")
    return name


def task_models(task: ModelSpec, declared: Mapping[str, ModelSpec]) -> dict[str, ModelSpec]:
    """Every task model by name: ``task``, the embedded ones, then the declared tables (one of an
    embedded model's name replaces it)."""
    builtin = {name: ModelSpec(backend="llamacpp", model=model) for name, model in BUILTIN_TASK_MODELS.items()}
    return {INITIAL: task, **builtin, **declared}


def initial_name(models: Mapping[str, ModelSpec], *, prefer: Sequence[str] = ()) -> str:
    """The name of ``[models.task]`` (``models[INITIAL]``): the first of ``prefer`` (the searched names),
    then of the declared and embedded names, whose table is the same; else ``task``."""
    task = models[INITIAL]
    declared = [n for n in models if n != INITIAL and n not in BUILTIN_TASK_MODELS]
    for name in [*prefer, *declared, *BUILTIN_TASK_MODELS]:
        if name in models and models[name] == task:
            return name
    return INITIAL


def searched_models(config: Any) -> tuple[Value, ...]:
    """The values ``[search.space]`` gives the table's ``model`` dimension (empty: not searched)."""
    return next((tuple(config.search.space.dimensions.get(d.name, ())) for d in DIMENSIONS if d.applies == "model"), ())


def in_play(config: Any, names: Sequence[str] = ()) -> dict[str, ModelSpec]:
    """The task models of ``config`` that may answer, by name: the initial one first, then the searched
    ones and ``names`` (a name the config does not give is left out: its check says so)."""
    models, initial = config.task_models(), config.initial_task_model()
    wanted = dict.fromkeys([initial, *(str(v) for v in searched_models(config)), *names])
    return {n: models[n] for n in wanted if n in models}


def served_name(spec: ModelSpec) -> str:
    """The model's name as its answers carry it (:attr:`opro.llm.client.Completion.model`)."""
    if spec.backend == "llamacpp" and spec.model not in EMBEDDED_MODELS:
        return Path(spec.model).stem
    return spec.model


def spec_key(spec: ModelSpec) -> str:
    """The model's key in the measured rates (:func:`opro.llm.rates.rate_key`)."""
    return rate_key(spec.backend, spec.model)


def check_served(models: Mapping[str, ModelSpec], *, prices: Mapping[str, Price], where: str) -> None:
    """Refuse two task models whose answers carry the same model name but would be priced differently:
    an answer says which model gave it, not which table."""
    seen: dict[str, tuple[str, Price | None]] = {}
    for name, spec in models.items():
        served, price = served_name(spec), prices.get(spec.model)
        other = seen.setdefault(served, (name, price))
        if other[1] != price:
            raise ConfigError(f"{where}: the task models {other[0]!r} and {name!r} both answer as {served!r} but have "
                              "different prices: give them the same prices (or use one of them)")


def needs_rates(specs: Mapping[str, ModelSpec], prices: Mapping[str, Price]) -> bool:
    """Whether the models ``specs`` are priced by measured seconds: more than one model answers and not
    every one has prices."""
    served = {served_name(s) for s in specs.values()}
    return len(served) > 1 and any(prices.get(s.model) is None for s in specs.values())


def task_cost_model(specs: Mapping[str, ModelSpec], *, prices: Mapping[str, Price], completion_weight: float,
                    rates: Mapping[str, TokenRate] | None = None) -> CostModel:
    """What an answer costs when the models ``specs`` (by name, the initial one first) may give it: as
    one model's (its prices, else weighted tokens) where they all answer as one model; in USD per model
    where every one has prices; else in seconds at ``rates`` (by :func:`spec_key`; a model missing
    there: :func:`opro.llm.speed.default_rate`)."""
    first = next(iter(specs.values()))
    price = prices.get(first.model)
    one = CostModel(price_prompt=None if price is None else price.prompt,
                    price_completion=None if price is None else price.completion, completion_weight=completion_weight)
    if len({served_name(s) for s in specs.values()}) < 2:
        return one
    per: dict[str, ModelCost] = {}
    seconds = needs_rates(specs, prices)
    for name, spec in specs.items():
        served = served_name(spec)
        if served in per:
            continue
        if not seconds:
            p = prices[spec.model]
            per[served] = ModelCost(served, p.prompt / 1e6, p.completion / 1e6, basis="prices", name=name)
            continue
        key = spec_key(spec)
        rate = (rates or {}).get(key) or default_rate(key, backend=spec.backend, model=spec.model)
        per[served] = ModelCost(served, rate.prompt_s, rate.completion_s, basis=rate.basis, name=name)
    return CostModel(price_prompt=one.price_prompt, price_completion=one.price_completion,
                     completion_weight=completion_weight, models=tuple(per.values()),
                     models_unit="seconds" if seconds else "usd")


def known_rates(specs: Mapping[str, ModelSpec], *, frozen: Path, record: Path) -> dict[str, TokenRate] | None:
    """The rates of ``specs``' models measured together, without measuring: the output folder's
    (``frozen``: the ones its first command used) where it has them all, else one calibration of the
    user's record (``record``); None where neither has them."""
    keys = list(dict.fromkeys(spec_key(s) for s in specs.values()))
    return together(load_token_rates(frozen), keys) or together(load_token_rates(record), keys)


def measured_rates(specs: Mapping[str, ModelSpec], *, frozen: Path, record: Path, backend: Callable[[ModelSpec], LLM],
                   seed: int = 0, notice: Callable[[str], None] | None = None) -> dict[str, TokenRate]:
    """:func:`known_rates`, else a calibration of every model of ``specs`` back to back (``backend``
    gives each one's, loaded once), kept in ``record``; an output folder without rates keeps them in
    ``frozen``, so its study's costs stay in one measure (a folder that has rates keeps its own)."""
    found = known_rates(specs, frozen=frozen, record=record)
    if found is None:
        wanted = {spec_key(s): s for s in specs.values()}
        found = calibrate({k: backend(s) for k, s in wanted.items()}, seed=seed, notice=notice)
        save_token_rates(found, record)
    if not frozen.is_file():
        save_token_rates(found, frozen, merge=False)
    return found


def task_spec(config: Any, name: str, *, where: str = "task_model") -> ModelSpec:
    """The model table ``config`` calls ``name``; a :class:`ConfigError` naming ``where`` and the choices otherwise."""
    spec: ModelSpec | None = config.task_models().get(name)
    if spec is None:
        raise ConfigError(f"{config.source}: {unknown_model(name, config, where=where)}")
    return spec


def model_key(config: Any, name: str) -> str:
    """The config key of the task model ``name``, as an error about its table names it."""
    if name == INITIAL:
        return "[models.task]"
    if name in dict(config.models.task_choices):
        return f"[models.task_choices.{name}]"
    return f"the embedded task model {name!r}"


def config_cost_model(config: Any, names: Sequence[str] = (), *, rates: Mapping[str, TokenRate] | None = None) -> CostModel:
    """:meth:`opro.config.OproConfig.cost_model`: where seconds price the models in play, the rates given, else
    the ones measured together (the output folder's, then the user's record), else the defaults."""
    specs, prices = in_play(config, names), config.prices()
    if rates is None and needs_rates(specs, prices):
        rates = known_rates(specs, frozen=RunDir(config.output_dir).task_rates, record=speed_path(config.call_cache_path))
    return task_cost_model(specs, prices=prices, rates=rates, completion_weight=float(config.optimizer.completion_weight))


def rates_here(config: Any, names: Sequence[str] = (), *, backend: Callable[[ModelSpec], LLM],
               notice: Callable[[str], None] | None = None) -> dict[str, TokenRate] | None:
    """The rates that price the task models in play (:func:`measured_rates`: calibrated here where none
    were measured together yet); None where they need none (one model, or prices for every one)."""
    specs = in_play(config, names)
    if not needs_rates(specs, config.prices()):
        return None
    return measured_rates(specs, frozen=RunDir(config.output_dir).task_rates, record=speed_path(config.call_cache_path),
                          backend=backend, seed=config.experiment.seed, notice=notice)


__all__ = ["BUILTIN_TASK_MODELS", "INITIAL", "check_name", "check_served", "config_cost_model", "in_play", "initial_name", "known_rates",
           "measured_rates", "model_key", "needs_rates", "rates_here", "searched_models", "served_name", "spec_key", "task_cost_model",
           "task_models", "task_spec"]
