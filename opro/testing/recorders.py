"""An in-memory recorder: what a test or a notebook passes where a command or a search records.

One class keeps both kinds of hook of the recording seam (:class:`~opro.search.records.Recorder`): a
command's (``records`` keeps every command record it is given) and a search's (``store`` keeps each step's candidates and the result, and the
study keeps what it recorded under the recorder's own keys, so a resumed search records nothing twice).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opro.search.records import CommandRecord, Recorded, Recorder

if TYPE_CHECKING:
    from opro.search.results import CandidateRecord, OptimizationResult
    from opro.search.study import SearchStudy


class MemoryRecorder(Recorder):
    """Records into lists. ``store`` may outlive the recorder (as a tracker's server does): pass the
    same list to a fresh recorder to see what a resumed search adds to it."""

    name = "memory"

    def __init__(self, store: list[tuple[str, Any]] | None = None) -> None:
        self.store: list[tuple[str, Any]] = [] if store is None else store
        self.records: list[CommandRecord] = []
        self._study: str | None = None

    # -- a command's record ------------------------------------------------------------------
    def record(self, record: CommandRecord) -> Recorded:
        self.records.append(record)
        n = len(self.records)
        return Recorded(recorder=self.name, ref=str(n), where=f"record {n} in memory")

    # -- a search's events -------------------------------------------------------------------
    def on_search_start(self, study: SearchStudy, *, lead: bool) -> None:
        self._study = study.name

    def on_step(self, study: SearchStudy, *, step: int, history: Sequence[CandidateRecord], best_score: float) -> None:
        logged = list(study.recorder_state("memory_logged") or [])
        if step not in logged:
            self.store.extend(("candidate", (r.step, r.instruction, r.score)) for r in history if r.step == step)
            study.set_recorder_state("memory_logged", [*logged, step])

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        digest = hashlib.sha256(json.dumps(result.best_instruction).encode()).hexdigest()
        if study.recorder_state("memory_result") != digest:
            self.store.append(("result", result.best_instruction))
            study.set_recorder_state("memory_result", digest)

    def recorded(self) -> Recorded | None:
        if self._study is None:
            return None
        return Recorded(recorder=self.name, ref=self._study, where=f"memory store of study {self._study}")


__all__ = ["MemoryRecorder"]
