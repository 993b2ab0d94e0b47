"""The probe is the search's first step, not a second bill: which of its calls ``opro optimize`` found
in the call cache, counted by key.

``opro probe`` keeps, beside ``probe.json``, the keys (:func:`opro.llm.client.cache_key`) of the calls
it sent to the models (``probe_calls.json``): not an estimate of what a search will ask, the calls
themselves. ``opro optimize`` listens to its own calls (:class:`opro.llm.client.CallLog`) and counts
the distinct keys it found in the cache that the probe made: the calls the probe saved it (without
the probe, the search would have made each of them once). The probe's contrasts are configured as
the search configures its first moves (:mod:`opro.probe.contrasts`) and its pilot starts with the
optimization questions, so step 0's initial configuration and first moves on those questions are
such calls; its other contrasts and its unused pilot questions are not asked by a search, and the
validation and held-out questions are never the probe's.

A probe run again with the same settings asks the same calls from the cache and keeps the keys its
earlier run made; a probe with other settings keeps only the keys it asks again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opro.errors import DataError
from opro.paths import RunDir

if TYPE_CHECKING:
    from opro.llm.client import CallLog


@dataclass(frozen=True)
class ProbeCalls:
    """The keys of the calls a probe sent to the models, by role."""

    made: Mapping[str, frozenset[str]]

    @property
    def n(self) -> int:
        return sum(len(keys) for keys in self.made.values())


def write_probe_calls(log: CallLog, *, output_dir: Path) -> Path:
    """``<output_dir>/probe_calls.json``: the keys the probe just made, and those an earlier probe made
    that it asked again (a rerun answered from the cache still owns the answers it paid for)."""
    run = RunDir(output_dir)
    earlier = read_probe_calls(output_dir)
    made = {role: set(keys) for role, keys in log.made.items()}
    for role, keys in (earlier.made.items() if earlier is not None else ()):
        kept = keys & log.cached.get(role, set())
        if kept:
            made.setdefault(role, set()).update(kept)
    run.root.mkdir(parents=True, exist_ok=True)
    run.probe_calls.write_text(json.dumps({"made": {r: sorted(k) for r, k in sorted(made.items())}}),
                              encoding="utf-8")
    return run.probe_calls


def read_probe_calls(output_dir: Path) -> ProbeCalls | None:
    """The probe's call keys kept in an output folder (None: no probe kept any)."""
    path = RunDir(output_dir).probe_calls
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ProbeCalls({str(role): frozenset(str(k) for k in keys) for role, keys in data["made"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path} is not a list of the probe's calls ({exc}): run `opro probe` again, "
                        "or delete it") from None


@dataclass(frozen=True)
class ProbeSaving:
    """What the probe's calls saved one run: by role, the distinct calls the run found in the cache
    that the probe made; and how many the probe made."""

    by_role: Mapping[str, int]
    probe_made: int

    @property
    def saved(self) -> int:
        return sum(self.by_role.values())

    def line(self) -> str:
        if not self.saved:
            return (f"probe: its {self.probe_made} calls saved this run none (this run asked none of them: "
                    "other settings, or the call cache is off)")
        roles = ", ".join(f"{role} {n}" for role, n in self.by_role.items() if n)
        return (f"probe: saved this run {self.saved} calls ({roles}): answers `opro probe` made, found in the call "
                f"cache (it made {self.probe_made})")


def probe_saving(probe: ProbeCalls, log: CallLog) -> ProbeSaving:
    """The calls of the run ``log`` heard that the probe made (each distinct call once)."""
    from opro.llm.client import ROLES

    order = sorted(log.cached, key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r))
    return ProbeSaving({role: len(log.cached[role] & probe.made.get(role, frozenset())) for role in order}, probe.n)


__all__ = ["ProbeCalls", "ProbeSaving", "probe_saving", "read_probe_calls", "write_probe_calls"]
