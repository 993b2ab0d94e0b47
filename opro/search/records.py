"""The one recording seam: what a command or a search leaves behind, and where.

A :class:`Recorder` has two kinds of hook, and every hook is optional (the defaults do nothing). A
command (compare, judge calibrate, probe, ...) builds one :class:`CommandRecord` (its kind, params,
metrics, tags and files) and hands it to each recorder's :meth:`Recorder.record`; a search
(:class:`~opro.search.loop.Search`) calls the search hooks at its events, in the spirit of Optuna's
callbacks. Each recorder says where it recorded (:class:`Recorded`). Neither a command nor the search
knows which trackers exist: MLflow and MLflow's GenAI runs are recorders made by
:mod:`opro.tracking.factory` from the config, and a test or a notebook can pass its own
(:class:`opro.testing.MemoryRecorder`).

Who calls the search hooks: every worker of a shared study gets ``on_search_start`` (``lead`` says whether
it is worker 0, which proposes and records), ``on_search_end`` and, when the search fails,
``on_search_failed``; only the lead gets ``on_meta_prompt``, ``on_step``, ``on_validation_batch``,
``on_validated``, ``on_validation_end`` and ``on_result``. A recorder keeps what it needs to resume (which
steps it logged, whether it recorded the result) in the study, under its own keys
(:meth:`~opro.search.study.SearchStudy.recorder_state`): the search's schema knows none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class EvaluatedPrompt:
    """One prompt a command evaluated, question by question: its label, template (a
    :class:`~opro.program.prompts.QATemplate`), the :class:`~opro.evaluation.rows.EvaluationReport`
    of its rows and the tags its own record takes. Most recorders keep a command's figures only; one
    that keeps every question (MLflow's GenAI evaluation runs) records these."""

    label: str
    template: Any
    report: Any
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandRecord:
    """What one command did. ``kind`` becomes the ``opro.kind`` tag (``probe``, ``judge-calibration``,
    ``comparison``); ``files`` maps each file to the folder it is filed under (``None``: the record's
    root). A folder among ``files`` stands for the files in it, filed under that folder as they lie.
    ``evaluations``: the prompts it evaluated on the questions of ``split``, question by question."""

    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[Path, str | None] = field(default_factory=dict)
    evaluations: tuple[EvaluatedPrompt, ...] = ()
    split: str | None = None
    #: Where the recorders before this one recorded it (:func:`record_all` says), for a recorder that
    #: links its record to another's (an evaluation run to its command's MLflow run).
    earlier: tuple[Recorded, ...] = ()


@dataclass(frozen=True)
class Recorded:
    """Where a recorder put a record: ``recorder`` (``mlflow``), ``ref`` (its own id, e.g. the run id)
    and ``where`` (words for a person, secrets redacted)."""

    recorder: str
    ref: str
    where: str


#: What the search hooks are handed, named by the search's types (a :class:`~opro.search.study.SearchStudy`,
#: its :class:`~opro.search.results.CandidateRecord` history, its :class:`~opro.search.results.OptimizationResult`
#: and :class:`~opro.evaluation.rows.EvaluationRow` answers), spelt ``Any`` here so that the seam sits below
#: the search that calls it; a recorder annotates its hooks with the real types.
Study = Any
Candidate = Any
Result = Any
Row = Any


@runtime_checkable
class Recorder(Protocol):
    """Records what a command or a search did; every hook is optional (the defaults do nothing). A
    hook that raises stops the command or the search as any other error would (recorders that must
    not slow the search queue their work). ``name`` is the recorder's kind, as its :class:`Recorded`
    says it."""

    name: str = "recorder"

    # -- a command's record ------------------------------------------------------------------
    def record(self, record: CommandRecord) -> Recorded | None:
        """Record one command's :class:`CommandRecord` and say where (None: nothing of this record is
        this recorder's to keep, as an evaluation recorder says of a record without evaluations, or a
        search's recorder of any command's)."""
        return None

    # -- a search's events -------------------------------------------------------------------
    def prepare(self, *, lead: bool) -> None:
        """The run begins; its documents, chunks and study come next. Slow set-up that needs none of
        them (a process, imports) can start here, to overlap that work instead of the first step's
        requests. Followed by :meth:`on_search_start`, or by :meth:`discard` when the run fails first."""
        return None

    def discard(self) -> None:
        """The run failed before its search started (or ended): release what :meth:`prepare` started.
        May follow any other hook, so it must be safe to call twice."""
        return None

    def on_search_start(self, study: Study, *, lead: bool) -> None:
        """The study is open and its history read; the first step is about to run."""
        return None

    def on_meta_prompt(self, *, step: int, text: str) -> None:
        """The lead sent ``text`` to the optimizer LLM for ``step``'s candidates."""
        return None

    def on_step(self, study: Study, *, step: int, history: Sequence[Candidate], best_score: float) -> None:
        """Step ``step`` is finished (by every worker); ``history`` is every candidate so far and
        ``best_score`` the best complete score so far (``-inf`` when none)."""
        return None

    def on_search_end(self, study: Study) -> None:
        """The steps are over; the validation stage (lead only) comes next."""
        return None

    def on_validated(self, study: Study, *, label: str, instruction: str, rows: Sequence[Row]) -> None:
        """The validation stage scored every question of one prompt (``label``: ``initial`` or
        ``finalist K``); its scores are in the study and ``rows`` are its answers and verdicts (the
        validation questions, in order). Not called for prompts a rerun found scored."""
        return None

    def on_validation_batch(self, study: Study, *, label: str, instruction: str, rows: Sequence[Row]) -> None:
        """One batch of one prompt's validation questions is scored and kept in the study (before
        :meth:`on_validated`, which comes once all of the prompt's batches were scored in this process):
        what a recorder keeps to record a prompt whose batches a killed run and its rerun scored apart."""
        return None

    def on_validation_end(self, study: Study) -> None:
        """The lead's validation stage is over (or there was none); the result comes next."""
        return None

    def on_result(self, study: Study, result: Result) -> None:
        """The lead's final result."""
        return None

    def on_search_failed(self, study: Study, error: BaseException, *, abandoned: bool) -> None:
        """The search stopped on ``error`` (``KeyboardInterrupt`` when the user stopped it);
        ``abandoned``: this worker gave up waiting for a lead that is gone."""
        return None

    def recorded(self) -> Recorded | None:
        """Where this recorder recorded the search (its kind, its own id, words for a person), once it
        knows (the lead's, from :meth:`on_search_end` on); None: nowhere of its own to name."""
        return None



def record_all(recorders: Sequence[Recorder], record: CommandRecord) -> tuple[Recorded, ...]:
    """``record`` through every recorder, in order, each told where the ones before it recorded it
    (:attr:`CommandRecord.earlier`); a recorder's failure is raised (a command that was asked to record
    and could not must say so, not pretend it did)."""
    done: list[Recorded] = []
    for r in recorders:
        where = r.record(replace(record, earlier=tuple(done)) if done else record)
        if where is not None:
            done.append(where)
    return tuple(done)


def finite_metrics(values: Mapping[str, float | None]) -> dict[str, float]:
    """The metrics that have a value (trackers take numbers, not ``None`` or NaN)."""
    return {k: float(v) for k, v in values.items() if v is not None and v == v}


__all__ = ["CommandRecord", "EvaluatedPrompt", "Recorded", "Recorder", "finite_metrics", "record_all"]
