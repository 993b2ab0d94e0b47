"""How fast each model answered on this machine, measured: what ``opro plan`` times a run by.

Every experiment's client factory records, when it closes, each model's calls of that command (the
ones made, not the cache's): prompt and completion tokens and seconds, in ``rates.json`` beside the
call cache (the per-user cache folder unless ``[experiment].cache_path`` puts it elsewhere). The plan
then times a role by what its model measured here, under whatever else this machine was running,
instead of a default measured on another machine: the dataset generation that took 1,780 s on a busy
2-core machine was planned at 9 minutes from the idle default. The latest command with at least
:data:`MIN_CALLS` calls of a model replaces that model's record.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RATES_FILE = "rates.json"
#: Fewer calls than this say too little about a model's speed to replace a record or a default.
MIN_CALLS = 3


@dataclass(frozen=True)
class MeasuredRate:
    """One model's calls in the last command that made enough of them (``key``: backend and model)."""

    key: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    #: When (UTC, ISO date and time).
    measured: str

    def factor(self, *, prefill: float, decode: float) -> float:
        """Measured seconds over what the default rates (prompt and completion tokens per second) give
        for the same tokens: 2.0 is twice as slow as the default."""
        predicted = self.prompt_tokens / prefill + self.completion_tokens / decode
        return self.seconds / predicted if predicted > 0 else 1.0

    def seconds_per_call(self, prompt: float, completion: float, *, prefill: float, decode: float) -> float:
        """One call of these tokens at this model's measured speed: the default rates' shape (prefill
        against decode), scaled by :meth:`factor`."""
        return self.factor(prefill=prefill, decode=decode) * (prompt / prefill + completion / decode)

    @property
    def latency(self) -> float:
        """Mean seconds per call (an endpoint's latency, which concurrency does not shorten)."""
        return self.seconds / self.calls if self.calls else 0.0


def rate_key(backend: str, model: str) -> str:
    return f"{backend}:{model}"


def rates_path(cache_path: Path) -> Path:
    """The record beside the call cache at ``cache_path``."""
    return cache_path.parent / RATES_FILE


def load_rates(path: Path) -> dict[str, MeasuredRate]:
    """The record at ``path`` by key; empty where there is none or it cannot be read (the plan then
    falls back to its defaults, and says so)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {k: MeasuredRate(**v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def record_rates(usage: Mapping[str, Mapping[str, Any]], *, path: Path, now: datetime | None = None) -> None:
    """Keep each model's usage (``{key: {"calls", "prompt_tokens", "completion_tokens", "wall_s"}}``) of
    at least :data:`MIN_CALLS` calls as its record, replacing the older one; written whole, atomically.
    A folder that cannot be written costs the record, never the command."""
    when = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    fresh = {k: MeasuredRate(key=k, calls=int(u["calls"]), prompt_tokens=int(u["prompt_tokens"]),
                             completion_tokens=int(u["completion_tokens"]), seconds=float(u["wall_s"]), measured=when)
             for k, u in usage.items() if int(u.get("calls", 0)) >= MIN_CALLS and float(u.get("wall_s", 0.0)) > 0}
    if not fresh:
        return
    keep_records({**load_rates(path), **fresh}, path, what="measured rates")


def keep_records(records: Mapping[str, Any], path: Path, *, what: str) -> None:
    """``records`` (dataclasses by key) written whole and atomically at ``path``; a folder that cannot be
    written costs the record, never the command (logged at debug as ``what`` not kept)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in sorted(records.items())}, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        logger.debug("%s not kept in %s: %s", what, path, exc)


__all__ = ["MIN_CALLS", "RATES_FILE", "MeasuredRate", "load_rates", "rate_key", "rates_path", "record_rates"]
