"""The composition root's own recorder: a run's ``summary.json`` and its copy in the study."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opro.experiment.result import RunResult
from opro.search.records import Recorder

if TYPE_CHECKING:
    from opro.paths import RunDir
    from opro.search.results import OptimizationResult
    from opro.search.study import SearchStudy


class SummaryWriter(Recorder):
    """``summary.json`` in ``run_dir`` (and its copy in the study, for ``opro compare best`` from the
    stores on any machine), written once, whole, after the run directory's files and before the
    trackers' recorders (``recorded_by``) log them as artifacts; with where those recorded the run.
    ``noise_digest`` and ``judge_noise`` are asked when the result comes (the task's noise digest and
    ``opro calibrate``'s note, as they stand then)."""

    def __init__(self, run_dir: RunDir, *, recorded_by: Sequence[Recorder], split_record: dict[str, Any] | None,
                 noise_digest: Callable[[], str | None], judge_noise: Callable[[], str | None]) -> None:
        self.run_dir = run_dir
        self.recorded_by = tuple(recorded_by)
        self.split_record = split_record
        self.noise_digest = noise_digest
        self.judge_noise = judge_noise
        self._run: tuple[OptimizationResult, RunResult] | None = None

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        summary = self.run_result(result).summary()
        # Which task's noise the validation scores measure: a plan reads them only for the same task.
        summary["noise_digest"] = self.noise_digest()
        if self.split_record is not None:
            summary["split_record"] = self.split_record
            study.save_split_record(self.split_record)
        study.save_summary(summary)
        self.run_dir.write_summary(summary)

    def run_result(self, result: OptimizationResult) -> RunResult:
        """``result`` with where it was recorded (the same object for the same result)."""
        if self._run is None or self._run[0] is not result:
            fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
            self._run = (result, RunResult(
                **fields,
                output_dir=self.run_dir.root,
                recorded=tuple(r for r in (x.recorded() for x in self.recorded_by) if r is not None),
                judge_noise=self.judge_noise(),
            ))
        return self._run[1]


__all__ = ["SummaryWriter"]
