"""What an answer costs: one definition for every caller (the search's candidates, ``opro compare``).

An answer's cost is its task-model call: money where the task model has prices (USD per million
prompt / completion tokens: ``[models.task].price_prompt`` / ``price_completion``, else the usage
ledger's built-in table), otherwise *task tokens*, prompt + ``completion_weight`` x completion,
because decoding a token is slower and dearer than reading one (``[optimizer].completion_weight``).
Only answered questions count: a failed call has no answer, so it has no cost per answer either;
an answer the judge could not read was still paid for, so it counts.

Where several task models answer (``[search.space].task_model``, ``opro compare --set task_model=...``),
tokens alone would call a 0.5B and a 1.5B model equally cheap: each answer is priced by the model that
gave it (its name is on the answer), in USD where every one of them has prices, else in *task seconds*:
its prompt and completion tokens at that model's own seconds per prompt and per completion token,
measured on this machine back to back with the others (:mod:`opro.llm.speed`). The wall seconds of an
answer are no measure (a cached answer keeps the seconds of the load it was first made under).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, Protocol

CostUnit = Literal["usd", "tokens", "seconds"]


class AnsweredCall(Protocol):
    """What the cost reads of an answered question (:class:`opro.evaluation.rows.EvaluationRow`)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def latency_s(self) -> float: ...
    @property
    def error(self) -> str | None: ...


def _model_of(row: AnsweredCall) -> str | None:
    """The model that answered ``row`` (rows from before answers named it: None, the default model)."""
    model = getattr(row, "model", None)
    return model if isinstance(model, str) and model else None


def amount(value: float, unit: str, *, signed: bool = False) -> str:
    """A cost as a figure or a table shows it: USD to three significant digits (``$0.000123``), task
    seconds to three (``0.412 s``), weighted tokens whole (``1,234``)."""
    sign = "-" if value < 0 else "+" if signed else ""
    if unit == "usd":
        return f"{sign}${abs(value):.3g}"
    if unit == "seconds":
        return f"{sign}{abs(value):.3g} s"
    return f"{value:+,.0f}" if signed else f"{value:,.0f}"


def parse_unit(text: Any) -> CostUnit:
    """A unit as stored (``summary.json``, the study): unknown ones, from before units were named, are tokens."""
    return "usd" if text == "usd" else "seconds" if text == "seconds" else "tokens"


@dataclass(frozen=True)
class CostSummary:
    """Means per answered question: prompt and completion tokens, seconds of the task call, cost."""

    n: int
    prompt_tokens: float
    completion_tokens: float
    seconds: float
    cost: float
    unit: CostUnit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostSummary:
        means = {f.name: float(data[f.name]) for f in fields(cls) if f.name not in ("n", "unit")}
        return cls(n=int(data["n"]), unit=parse_unit(data.get("unit")), **means)


@dataclass(frozen=True)
class ModelCost:
    """What one task model's tokens cost, in its :class:`CostModel`'s unit: USD, or seconds measured here."""

    #: The model's name as its answers carry it (:attr:`opro.llm.client.Completion.model`).
    model: str
    prompt: float
    completion: float
    #: Where the figures come from ("prices", "calibrated here on DATE", "default: ...").
    basis: str = ""
    #: The name the config gives it (``task``, ``0.5b``, a ``[models.task_choices]`` table's).
    name: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.prompt) and math.isfinite(self.completion)) or min(self.prompt, self.completion) < 0:
            raise ValueError(f"{self.model}: a cost per token must be a number >= 0, got {self.prompt!r}, "
                             f"{self.completion!r}")


@dataclass(frozen=True)
class CostModel:
    """How tokens become a cost. Prices in USD per million tokens (both or neither): one task model's.

    With ``models`` (several task models), each answer is priced by the model that gave it, per token in
    ``models_unit`` (USD, or seconds measured here); the first is the initial configuration's, which
    also prices an answer that names no model."""

    price_prompt: float | None = None
    price_completion: float | None = None
    completion_weight: float = 4.0
    models: tuple[ModelCost, ...] = ()
    models_unit: Literal["usd", "seconds"] = "seconds"

    def __post_init__(self) -> None:
        if (self.price_prompt is None) != (self.price_completion is None):
            raise ValueError("give both prices (USD per million prompt and completion tokens), or neither")
        if not math.isfinite(self.completion_weight) or self.completion_weight < 0:
            raise ValueError(f"completion_weight must be a number >= 0, got {self.completion_weight!r}")

    @property
    def unit(self) -> CostUnit:
        if self.models:
            return self.models_unit
        return "tokens" if self.price_prompt is None else "usd"

    @property
    def measure(self) -> str:
        """The cost measure in words, as a figure or a column names it: ``USD``, ``weighted task
        tokens (prompt + 4 x completion)`` or ``task seconds (each model's tokens at its seconds per
        token measured here)``."""
        if self.unit == "usd":
            return "USD"
        if self.unit == "seconds":
            return "task seconds (each model's tokens at its seconds per token measured here)"
        return f"weighted task tokens (prompt + {self.completion_weight:g} x completion)"

    @property
    def short(self) -> str:
        """The unit in a few words, for a line of text: ``USD``, ``task tokens, completion x4``, ``task seconds``."""
        return {"usd": "USD", "seconds": "task seconds at measured rates"}.get(
            self.unit, f"task tokens, completion x{self.completion_weight:g}")

    def model_cost(self, model: str | None) -> ModelCost | None:
        """``model``'s figures (its answers' name, or the name the config gives it); the first model's for
        None or a model not listed; None with one model."""
        if not self.models:
            return None
        return next((m for m in self.models if model in (m.model, m.name)), self.models[0])

    def of(self, *, prompt_tokens: float, completion_tokens: float, model: str | None = None) -> float:
        """One answer's cost: USD with prices, else weighted task tokens; with several models, at the
        figures of ``model`` (the one that answered)."""
        per = self.model_cost(model)
        if per is not None:
            return prompt_tokens * per.prompt + completion_tokens * per.completion
        if self.price_prompt is not None and self.price_completion is not None:
            return (prompt_tokens * self.price_prompt + completion_tokens * self.price_completion) / 1e6
        return prompt_tokens + self.completion_weight * completion_tokens

    def of_call(self, row: AnsweredCall) -> float:
        """What the answered call ``row`` cost (at the figures of the model that gave it)."""
        return self.of(prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens, model=_model_of(row))

    def per_answer(self, rows: Iterable[AnsweredCall]) -> list[float | None]:
        """Each row's cost, None where the call failed (no answer): what paired differences read."""
        return [None if r.error is not None else self.of_call(r) for r in rows]

    def describe(self) -> dict[str, Any]:
        """The unit and each model's figures (what a study's costs were measured in: its fingerprint)."""
        return {"unit": self.unit, "models": [[m.name or m.model, m.model, float(f"{m.prompt:.6g}"),
                                               float(f"{m.completion:.6g}")] for m in self.models]}

    def summarize(self, rows: Iterable[AnsweredCall]) -> CostSummary | None:
        """Means over the answered rows; None when none was answered."""
        answered = [r for r in rows if r.error is None]
        if not answered:
            return None
        prompt = statistics.fmean(r.prompt_tokens for r in answered)
        completion = statistics.fmean(r.completion_tokens for r in answered)
        return CostSummary(
            n=len(answered), prompt_tokens=prompt, completion_tokens=completion,
            seconds=statistics.fmean(r.latency_s for r in answered),
            # The cost is linear in the tokens, so with one model the cost of the means is the mean of
            # the costs; with several, each answer is priced at its own model's figures.
            cost=statistics.fmean(self.of_call(r) for r in answered) if self.models
            else self.of(prompt_tokens=prompt, completion_tokens=completion), unit=self.unit,
        )


@dataclass(frozen=True)
class Difference:
    """A paired mean difference (prompt - baseline) over the questions both answered, with its
    Student t interval (None below 2 pairs)."""

    estimate: float
    ci: tuple[float, float] | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "low": None if self.ci is None else self.ci[0],
                "high": None if self.ci is None else self.ci[1], "n": self.n}

    def text(self, digits: int = 0) -> str:
        ci = "" if self.ci is None else f" [{self.ci[0]:+.{digits}f}, {self.ci[1]:+.{digits}f}]"
        return f"{self.estimate:+.{digits}f}{ci}"


@dataclass(frozen=True)
class CostDifference:
    """A prompt's cost per answer against a baseline's, paired on the questions both answered:
    tokens (prompt + completion, unweighted), seconds and cost."""

    tokens: Difference
    seconds: Difference
    cost: Difference
    #: The baseline's mean cost on those questions (what a relative saving is a share of).
    baseline_cost: float
    #: The baseline's mean tokens per answer on those questions.
    baseline_tokens: float = math.nan
    #: The share of the baseline's tokens per answer saved, ``1 - mean(tokens) / mean(baseline's)``: its
    #: Fieller interval (:func:`opro.stats.ratio.saving_interval`; None below 2 pairs or not estimable).
    tokens_saving_ci: tuple[float, float] | None = None
    #: Where the baseline's tokens are heavy-tailed, what that interval is worth (:func:`opro.stats.ratio.saving_caveat`).
    tokens_caveat: str = ""

    @property
    def lower(self) -> bool:
        """The cost per answer is lower: its paired interval lies below 0."""
        return self.cost.ci is not None and self.cost.ci[1] < 0

    def as_dict(self) -> dict[str, Any]:
        ci = self.tokens_saving_ci
        return dict(tokens=self.tokens.as_dict(), seconds=self.seconds.as_dict(), cost=self.cost.as_dict(),
                    baseline_cost=self.baseline_cost, baseline_tokens=self.baseline_tokens, lower=self.lower,
                    tokens_saving_ci=None if ci is None else list(ci),
                    **({"tokens_saving_caveat": self.tokens_caveat} if self.tokens_caveat else {}))

    def saving_text(self) -> str:
        """Tokens per answer as a share of the baseline's, with the Fieller interval of that share (a ratio
        of paired means: the baseline's mean is estimated too), and seconds per answer."""
        t, s = self.tokens, self.seconds
        if self.baseline_tokens > 0:
            share = -t.estimate / self.baseline_tokens
            word = "fewer" if share >= 0 else "more"
            tokens = f"{abs(share):.0%} {word} tokens per answer"
            if self.tokens_saving_ci is not None:  # the interval in the estimate's own words ("[1%, 4% more]")
                lo, hi = self.tokens_saving_ci if share >= 0 else (-self.tokens_saving_ci[1], -self.tokens_saving_ci[0])
                tokens += f" [{lo:.0%}, {hi:.0%} {word}]" + (f" ({self.tokens_caveat})" if self.tokens_caveat else "")
        else:
            tokens = f"tokens per answer {t.text(0)}"
        return f"{tokens}, seconds per answer {s.text(2)}"


def _difference(values: list[float], *, level: float) -> Difference:
    from opro.stats.sequential import t_interval

    return Difference(estimate=statistics.fmean(values), ci=t_interval(values, level=level), n=len(values))


def paired_difference(rows: Sequence[AnsweredCall], baseline: Sequence[AnsweredCall], *, model: CostModel,
                      level: float = 0.95) -> CostDifference | None:
    """``rows`` - ``baseline``, question by question (the same questions in the same order), over the
    questions both answered; None when there is no such question."""
    from opro.stats.ratio import saving_caveat, saving_interval

    if len(rows) != len(baseline):
        raise ValueError(f"paired rows differ in length: {len(rows)} and {len(baseline)}")
    pairs = [(a, b) for a, b in zip(rows, baseline, strict=True) if a.error is None and b.error is None]
    if not pairs:
        return None

    def tokens(r: AnsweredCall) -> float:
        return float(r.prompt_tokens + r.completion_tokens)

    cost = model.of_call
    return CostDifference(
        tokens=_difference([tokens(a) - tokens(b) for a, b in pairs], level=level),
        seconds=_difference([a.latency_s - b.latency_s for a, b in pairs], level=level),
        cost=_difference([cost(a) - cost(b) for a, b in pairs], level=level),
        baseline_cost=statistics.fmean(cost(b) for _, b in pairs),
        baseline_tokens=statistics.fmean(tokens(b) for _, b in pairs),
        tokens_saving_ci=saving_interval([tokens(a) for a, _ in pairs], [tokens(b) for _, b in pairs], level=level),
        tokens_caveat=saving_caveat([tokens(b) for _, b in pairs]),
    )


@dataclass(frozen=True)
class CallUsage:
    """An answered call's usage on its own (what the search keeps per question), and the model that
    answered it (None: the default one)."""

    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    error: str | None = None
    model: str | None = None

    @classmethod
    def of(cls, row: AnsweredCall) -> CallUsage:
        return cls(int(row.prompt_tokens), int(row.completion_tokens), float(row.latency_s), row.error, _model_of(row))

    def as_list(self) -> list[Any]:
        return [self.prompt_tokens, self.completion_tokens, self.latency_s, *([self.model] if self.model else [])]

    @classmethod
    def from_list(cls, value: Any) -> CallUsage:
        prompt, completion, seconds, *model = value
        return cls(int(prompt), int(completion), float(seconds), model=str(model[0]) if model else None)


__all__ = ["AnsweredCall", "CallUsage", "CostDifference", "CostModel", "CostSummary", "CostUnit", "Difference",
           "ModelCost", "amount", "paired_difference", "parse_unit"]
