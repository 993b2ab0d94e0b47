"""One place that turns model specs into chat clients: a model pool, a call cache and a usage ledger.

Shared by :class:`opro.experiment.Experiment` (a client per configured role) and the commands that
name their models on the command line (``opro dataset generate``, ``opro judge agreement``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from opro.llm.cache import CallCache
from opro.llm.client import ChatClient, UsageLedger
from opro.llm.pool import ModelPool, ModelSpec
from opro.paths import default_call_cache_path


def open_cache(path: str | Path | None = None, *, enabled: bool = True) -> CallCache | None:
    """The call cache at ``path`` (default: the per-user one), or None when caching is off."""
    return CallCache(path or default_call_cache_path()) if enabled else None


class ClientFactory:
    """Chat clients over one pool (loaded models shared between roles), one cache and one ledger.

    Owns what it opened: :meth:`close` closes the pool and the cache.
    """

    def __init__(
        self,
        *,
        pool: ModelPool | None = None,
        cache: CallCache | None = None,
        usage: UsageLedger | None = None,
        seed: int = 0,
        rates: Path | None = None,
    ) -> None:
        self.pool = pool or ModelPool()
        self.cache = cache
        self.usage = usage or UsageLedger()
        self.seed = seed
        #: Where each model's measured speed is kept on close (:mod:`opro.llm.rates`); None: not kept.
        self.rates = rates
        # Each client's spec by role and the model name its answers carry (a role may have several models).
        self._specs: dict[tuple[str, str], ModelSpec] = {}
        # The limit each role's calls to an endpoint count against: its first model's there.
        self._limits: dict[tuple[str, str], threading.BoundedSemaphore] = {}

    def client(self, spec: ModelSpec, *, role: str, kind: type[ChatClient] = ChatClient) -> ChatClient:
        """A client of ``spec`` for ``role``; ``kind`` a :class:`ChatClient` subclass (a budgeted one).

        The models of one role on one server (the task models a search chooses among) share the
        concurrency limit of that role's first model there: two models on one endpoint do not double
        what it is sent."""
        llm = self.pool.get(spec)
        self._specs[(role, llm.model)] = spec
        limit = self._limits.setdefault((role, str(spec.base_url)), llm.slots) if spec.backend == "openai" else None
        return kind(llm, role=role, cache=self.cache, usage=self.usage, seed=self.seed, limit=limit)

    def measured(self) -> dict[str, dict[str, float]]:
        """This factory's calls so far per model (:func:`opro.llm.rates.rate_key`), its roles added up;
        scripted models, which take no time, left out."""
        from opro.llm.rates import rate_key

        out: dict[str, dict[str, float]] = {}
        for (role, model), u in self.usage.by_model().items():
            spec = self._specs.get((role, model))
            if spec is None or spec.backend == "scripted":
                continue
            got = out.setdefault(rate_key(spec.backend, spec.model), dict.fromkeys(
                ("calls", "prompt_tokens", "completion_tokens", "wall_s"), 0.0))
            for name in got:
                got[name] += getattr(u, name)
        return out

    def close(self) -> None:
        if self.rates is not None:
            from opro.llm.rates import record_rates

            record_rates(self.measured(), path=self.rates)
        self.pool.close()
        if self.cache is not None:
            self.cache.close()

    def __enter__(self) -> ClientFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ClientFactory", "open_cache"]
