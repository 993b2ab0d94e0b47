"""Each task model's seconds per prompt token and per completion token on this machine, measured back to back.

Where several task models answer and not all of them have prices, an answer's cost is its tokens at
the answering model's own rates (:mod:`opro.program.cost`). Tokens alone would call a 0.5B and a 1.5B
model equally cheap, and an answer's wall seconds are no measure (a cached answer keeps the seconds
of the load it was first made under; a search's calls run beside whatever else the machine runs). So
the rates come from a short fixed *calibration*: every model in play answers the same kinds of call,
interleaved round by round so that they share the machine's conditions: a long prompt read with one
token written (the prompt rate), a short prompt with a few dozen tokens written (the completion
rate). Each call is asked of the backend directly (no call cache: a cached reply has no fresh
seconds) with prompts no prefix cache has seen; the first call of each model, which loads it, is not
timed. Seconds are the backend's own measure of each call.

The rates are kept in :data:`SPEED_FILE` beside the call cache (by model, with the calibration they
came from: models compared must come from one), and an output folder keeps the rates its first
command used (:attr:`opro.paths.RunDir.task_rates`) so that a study's costs, and a resume, stay in one measure.
Before any calibration the plan uses the idle defaults of :func:`default_rate`, and says so.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from opro.llm.client import LLM, Completion, GenerationOptions, Message

logger = logging.getLogger(__name__)

SPEED_FILE = "token_rates.json"
#: Calibration rounds: each one a reading and a writing call per model (and one loading call before).
ROUNDS = 2
#: Words of a reading call's prompt (about 1.3 tokens a word) and tokens of a writing call's answer.
READ_WORDS = 220
WRITE_TOKENS = 32

#: Idle speeds of the embedded models on 2 cores (prompt, completion tokens per second), from the
#: quickstart's measured usage (docs/statistics.md): the plan's defaults before anything was measured.
EMBEDDED_SPEED = {"0.5b": (150.0, 18.0), "1.5b": (90.0, 9.0)}
_WORDS = ("model", "answer", "context", "layer", "network", "image", "training", "result", "paper", "data",
          "filter", "weight", "method", "figure", "value", "error", "table", "signal", "batch", "report")


@dataclass(frozen=True)
class TokenRate:
    """One model's seconds per prompt token and per completion token (``key``: backend and model)."""

    key: str
    prompt_s: float
    completion_s: float
    #: When (UTC, ISO date and time), and which calibration: the models of one were measured together.
    measured: str
    session: str
    calls: int = 0

    @property
    def basis(self) -> str:
        return f"calibrated here on {self.measured[:10]}" if self.calls else self.session


def speed_path(cache_path: Path) -> Path:
    """The calibrations beside the call cache at ``cache_path``."""
    return cache_path.parent / SPEED_FILE


def load_token_rates(path: Path) -> dict[str, TokenRate]:
    """The rates kept at ``path`` by key; empty where there are none or they cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {k: TokenRate(**v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def save_token_rates(rates: Mapping[str, TokenRate], path: Path, *, merge: bool = True) -> None:
    """Keep ``rates`` at ``path`` (with the ones there, replaced by key, unless ``merge`` is off), written
    whole and atomically; a folder that cannot be written costs the record, never the command."""
    from opro.llm.rates import keep_records

    keep_records({**(load_token_rates(path) if merge else {}), **rates}, path, what="token rates")


def together(rates: Mapping[str, TokenRate], keys: Sequence[str]) -> dict[str, TokenRate] | None:
    """The rates of ``keys`` where all are there and were measured in one calibration; else None."""
    found = [rates.get(k) for k in keys]
    if any(r is None for r in found) or len({r.session for r in found if r is not None}) != 1:
        return None
    return {k: r for k, r in zip(keys, found, strict=True) if r is not None}


def default_rate(key: str, *, backend: str, model: str) -> TokenRate:
    """What the plan assumes before a calibration: the idle default of an embedded model of that size
    (an endpoint or another GGUF: the 1.5B's, said to be assumed); a scripted model takes no time."""
    if backend == "scripted":
        return TokenRate(key, 0.0, 0.0, measured="", session="scripted: no time")
    size = "0.5b" if "0.5b" in model.lower() else "1.5b"
    prefill, decode = EMBEDDED_SPEED[size]
    said = (f"default for a {size.upper()} embedded model on 2 idle cores" if backend == "llamacpp"
            else "assumed (the 1.5B embedded default)")
    return TokenRate(key, 1.0 / prefill, 1.0 / decode, measured="", session=f"{said}; not calibrated yet")


def _prompts(seed: int, round_: int, model: int) -> tuple[str, str]:
    """A reading prompt (long, new to every prefix cache) and a writing prompt (short)."""
    rng = random.Random(f"{seed}:{round_}:{model}")
    words = " ".join(rng.choice(_WORDS) for _ in range(READ_WORDS))
    start = rng.randrange(100, 900)
    return (f"Notes {rng.random():.6f}: {words}\nReply with one word: done.",
            f"Count upward from {start}, one number after another, separated by spaces, without stopping.")


def _fit(reads: Sequence[Completion], writes: Sequence[Completion]) -> tuple[float, float]:
    """Seconds per prompt and per completion token from the reading and the writing calls: the prompt
    rate from the reads (less their few written tokens), the completion rate from the writes (less their
    prompts), refined once."""
    def total(calls: Sequence[Completion], attr: str) -> float:
        return float(sum(getattr(c, attr) for c in calls))

    seconds_r, seconds_w = total(reads, "latency_s"), total(writes, "latency_s")
    p_r, c_r = max(1.0, total(reads, "prompt_tokens")), total(reads, "completion_tokens")
    p_w, c_w = total(writes, "prompt_tokens"), max(1.0, total(writes, "completion_tokens"))
    prompt = seconds_r / p_r
    completion = max(0.0, seconds_w - prompt * p_w) / c_w
    prompt = max(0.0, seconds_r - completion * c_r) / p_r
    return prompt, completion


def calibrate(llms: Mapping[str, LLM], *, seed: int = 0, rounds: int = ROUNDS,
              notice: Callable[[str], None] | None = None, now: datetime | None = None) -> dict[str, TokenRate]:
    """Measure every backend of ``llms`` (by rate key) back to back: one loading call each, then
    ``rounds`` rounds of a reading and a writing call per model, interleaved. Raises what a backend
    raises (a model that cannot answer cannot be priced)."""
    when = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    session = f"calibration {when}"
    if notice is not None:
        notice(f"calibrating the task models' speed here: {', '.join(llms)} ({1 + 2 * rounds} calls each, back to back)")
    greedy = GenerationOptions(temperature=0.0, max_tokens=1, seed=seed)
    for llm in llms.values():  # loads the model: not timed
        llm.generate((Message("user", "Say yes."),), greedy)
    reads: dict[str, list[Completion]] = {k: [] for k in llms}
    writes: dict[str, list[Completion]] = {k: [] for k in llms}
    for r in range(rounds):
        for i, (key, llm) in enumerate(llms.items()):
            read, write = _prompts(seed, r, i)
            reads[key].append(llm.generate((Message("user", read),), greedy))
            writes[key].append(llm.generate((Message("user", write),),
                                            GenerationOptions(temperature=0.0, max_tokens=WRITE_TOKENS, seed=seed)))
    out = {}
    for key in llms:
        prompt, completion = _fit(reads[key], writes[key])
        out[key] = TokenRate(key, prompt, completion, measured=when, session=session, calls=2 * rounds)
    return out


__all__ = ["EMBEDDED_SPEED", "ROUNDS", "SPEED_FILE", "TokenRate", "calibrate", "default_rate", "load_token_rates",
           "save_token_rates", "speed_path", "together"]
