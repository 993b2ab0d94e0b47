"""The run directory's recorder: what a search leaves in the output folder.

:class:`RunDirRecorder` writes every meta-prompt as it is sent, then ``best_prompt.txt``,
``history.jsonl`` and the plots. ``summary.json`` is the composition root's
(:class:`opro.experiment.Experiment`), which asks the other recorders where they recorded the run; the
trackers' recorders (:func:`opro.tracking.factory.search_recorders`) go after both, so their
artifacts are the finished files.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from opro.paths import RunDir
from opro.program.cost import CostModel
from opro.search.records import Recorded, Recorder

if TYPE_CHECKING:
    from opro.search.results import CandidateRecord, OptimizationResult
    from opro.search.study import SearchStudy


class RunDirRecorder(Recorder):
    """The run directory: every meta-prompt as it is sent, then the result's files and plots."""

    name = "run_dir"

    def __init__(self, run_dir: RunDir, *, cost: CostModel | None = None) -> None:
        self.run_dir = run_dir
        #: What an answer costs (the search's measure): named on pareto.png's axis.
        self.cost = cost if cost is not None else CostModel()

    def recorded(self) -> Recorded:
        return Recorded(recorder=self.name, ref=str(self.run_dir.root), where=f"run directory {self.run_dir.root}")

    def on_meta_prompt(self, *, step: int, text: str) -> None:
        self.run_dir.write_metaprompt(step, text)

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        from opro.search.results import optimism_points
        from opro.tracking.plots import plot_optimism, plot_trajectory

        out = self.run_dir
        out.write_result(
            best_template=result.best_template,
            history=[_history_line(r) for r in result.history],
        )
        plot_trajectory(
            steps=[r.step for r in result.history],
            scores=[r.score for r in result.history],
            pruned=[r.pruned for r in result.history],
            path=out.trajectory_plot,
            n_questions=max((r.n_scored + r.n_invalid + r.n_errors for r in result.history if not r.pruned), default=None),
        )
        if result.validation is not None and result.validation.finalists:
            plot_optimism(optimism_points(result), path=out.optimism_plot)
        if result.objective.non_inferiority:
            self._pareto(result)

    def _pareto(self, result: OptimizationResult) -> None:
        """pareto.png: every candidate with a score and a cost, the pruned ones faded at their running
        means, the front joined; the axis names the cost measure."""
        from opro.search.results import quality_cost_front
        from opro.tracking.plots import ParetoPoint, plot_pareto

        front = {r.trial_number for r in quality_cost_front(result.history)}
        shown = [r for r in result.history if r.status in ("complete", "pruned") and r.score is not None
                 and r.cost is not None]
        if shown:
            plot_pareto([ParetoPoint(label=r.name, score=r.score, cost=r.cost.cost,  # type: ignore[arg-type,union-attr]
                                     front=r.trial_number in front, pruned=r.status == "pruned",
                                     initial=r.step == 0 and r.name == result.initial_instruction.strip(),
                                     returned=r.name == result.best_name) for r in shown],
                        path=self.run_dir.pareto_plot, cost_label=self.cost.measure)


def _history_line(r: CandidateRecord) -> dict[str, object]:
    """A candidate's line of ``history.jsonl``: its record, with its ``name`` only where that is not
    its instruction (the initial instruction with other settings; lines of other candidates read as
    they always did)."""
    line = {**asdict(r), "pruned": r.pruned, "partial": r.partial}
    if line["name"] == r.instruction:
        del line["name"]
    return line


__all__ = ["Recorder", "RunDirRecorder"]
