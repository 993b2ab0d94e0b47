"""What a search leaves behind, behind one seam: recorders the search calls at its events.

In the spirit of Optuna's callbacks, :class:`~opro.search.loop.Search` proposes, scores and stops; it
knows nothing of the output folder, MLflow or the Prompt Registry. The composition root
(:class:`~opro.experiment.Experiment`) builds the recorders and hands them over, in order.

Who calls what: every worker of a shared study gets ``on_search_start`` (``lead`` says whether it
is worker 0, which proposes and records), ``on_search_end`` and, when the search fails,
``on_search_failed``; only the lead gets ``on_meta_prompt``, ``on_step``, ``on_validation_batch``, ``on_validated``,
``on_validation_end`` and ``on_result``. A recorder keeps what it needs to resume (which steps it logged, whether it recorded
the result) in the study, under its own keys (:meth:`~opro.search.study.SearchStudy.recorder_state`):
the search's schema knows none of them. Each recorder says where it recorded (:meth:`Recorder.recorded`,
an :class:`opro.tracking.records.Recorded` as every command's recorders do), so the composition root reports
it without knowing which recorders there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from opro.evaluation.rows import EvaluationRow
    from opro.search.results import CandidateRecord, OptimizationResult
    from opro.search.study import SearchStudy
    from opro.tracking.records import Recorded


class Recorder(Protocol):
    """Hooks of the search; every one is optional (the defaults do nothing). A hook that raises stops
    the search as any other error would (recorders that must not slow the search queue their work)."""

    def prepare(self, *, lead: bool) -> None:
        """The run begins; its documents, chunks and study come next. Slow set-up that needs none of
        them (a process, imports) can start here, to overlap that work instead of the first step's
        requests. Followed by :meth:`on_search_start`, or by :meth:`discard` when the run fails first."""
        return None

    def discard(self) -> None:
        """The run failed before its search started (or ended): release what :meth:`prepare` started.
        May follow any other hook, so it must be safe to call twice."""
        return None

    def on_search_start(self, study: SearchStudy, *, lead: bool) -> None:
        """The study is open and its history read; the first step is about to run."""
        return None

    def on_meta_prompt(self, *, step: int, text: str) -> None:
        """The lead sent ``text`` to the optimizer LLM for ``step``'s candidates."""
        return None

    def on_step(self, study: SearchStudy, *, step: int, history: Sequence[CandidateRecord], best_score: float) -> None:
        """Step ``step`` is finished (by every worker); ``history`` is every candidate so far and
        ``best_score`` the best complete score so far (``-inf`` when none)."""
        return None

    def on_search_end(self, study: SearchStudy) -> None:
        """The steps are over; the validation stage (lead only) comes next."""
        return None

    def on_validated(
        self, study: SearchStudy, *, label: str, instruction: str, rows: Sequence[EvaluationRow]
    ) -> None:
        """The validation stage scored every question of one prompt (``label``: ``initial`` or
        ``finalist K``); its scores are in the study and ``rows`` are its answers and verdicts (the
        validation questions, in order). Not called for prompts a rerun found scored."""
        return None

    def on_validation_batch(
        self, study: SearchStudy, *, label: str, instruction: str, rows: Sequence[EvaluationRow]
    ) -> None:
        """One batch of one prompt's validation questions is scored and kept in the study (before
        :meth:`on_validated`, which comes once all of the prompt's batches were scored in this process):
        what a recorder keeps to record a prompt whose batches a killed run and its rerun scored apart."""
        return None

    def on_validation_end(self, study: SearchStudy) -> None:
        """The lead's validation stage is over (or there was none); the result comes next."""
        return None

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        """The lead's final result."""
        return None

    def on_search_failed(self, study: SearchStudy, error: BaseException, *, abandoned: bool) -> None:
        """The search stopped on ``error`` (``KeyboardInterrupt`` when the user stopped it);
        ``abandoned``: this worker gave up waiting for a lead that is gone."""
        return None

    def recorded(self) -> Recorded | None:
        """Where this recorder recorded the search (its kind, its own id, words for a person), once it
        knows (the lead's, from :meth:`on_search_end` on); None: nowhere of its own to name."""
        return None


__all__ = ["Recorder"]
