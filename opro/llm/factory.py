"""One place that turns model specs into chat clients: a model pool, a call cache and a usage ledger.

Shared by :class:`opro.experiment.Experiment` (a client per configured role) and the commands that
name their models on the command line (``opro dataset generate``, ``opro judge agreement``).
"""

from __future__ import annotations

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
    ) -> None:
        self.pool = pool or ModelPool()
        self.cache = cache
        self.usage = usage or UsageLedger()
        self.seed = seed

    def client(self, spec: ModelSpec, *, role: str, kind: type[ChatClient] = ChatClient) -> ChatClient:
        """A client of ``spec`` for ``role``; ``kind`` a :class:`ChatClient` subclass (a budgeted one)."""
        return kind(self.pool.get(spec), role=role, cache=self.cache, usage=self.usage, seed=self.seed)

    def close(self) -> None:
        self.pool.close()
        if self.cache is not None:
            self.cache.close()

    def __enter__(self) -> ClientFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ClientFactory", "open_cache"]
