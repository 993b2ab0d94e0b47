"""The validation stage of ``opro optimize`` as MLflow GenAI evaluation runs: :class:`ValidationTraces`, a
search recorder that keeps each validated prompt's rows (a file per prompt, until MLflow has them) and
logs one evaluation run per prompt, linked to the optimization's MLflow run, in the background."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.redaction import redact_text
from opro.search.records import Recorder
from opro.tracking.evaluations import _logger_settings, genai_logger
from opro.tracking.genai import GenAILogger, GenAIRecord, PromptEvaluation
from opro.tracking.recorder import MlflowRecorder

if TYPE_CHECKING:
    from opro.evaluation.batch import EvaluationReport, EvaluationRow
    from opro.program.prompts import QATemplate
    from opro.search.results import OptimizationResult
    from opro.search.study import SearchStudy
    from opro.tracking.sidecar import Sidecar
    from opro.tracking.workbench import Workbench


logger = logging.getLogger(__name__)


class ValidationTraces(Recorder):
    """The recorder that logs the validation stage of the search as evaluation runs, one per prompt
    (the initial instruction and each finalist). Goes after ``tracking``, whose run it links to.

    With ``tracking``'s sidecar process (:attr:`MlflowRecorder.sidecar`) the MLflow part (about 0.1 s
    of CPU per trace in its SQLAlchemy store, plus seconds of imports) runs there, so it never takes
    this process's GIL from the search: when the search starts the sidecar imports MLflow's
    evaluation harness and registers the dataset splits while the search waits on its models. Each
    prompt is sent as soon as the validation stage has scored it (:meth:`on_validated`), with the
    answers and verdicts the scoring produced (nothing is asked again), on ``tracking``'s background
    thread (in order with the run it links to), and written while the later prompts are still being
    asked. Without a sidecar the same work runs on that thread. A prompt a rerun found already scored
    was recorded by the run that scored it; nothing is asked again to record it.
    """

    def __init__(self, experiment: Workbench, *, tracking: MlflowRecorder) -> None:
        self.experiment = experiment
        self.tracking = tracking
        self._log: Any = None
        self._sidecar: Sidecar | None = None
        self._prewarmed: Future[None] | None = None
        #: Label -> the queued record of that prompt's evaluation run (None: already recorded before).
        self._logged: dict[str, Future[GenAIRecord | None]] = {}

    def on_search_start(self, study: SearchStudy, *, lead: bool) -> None:
        self._sidecar = self.tracking.sidecar
        if self._sidecar is not None:
            self._sidecar.retain()
            self._sidecar.host("genai", functools.partial(GenAILogger, **_logger_settings(self.experiment)))
            self._log = self._sidecar.proxy("genai")
        self._prewarmed = self.tracking.in_background(self._prewarm)

    def _logger(self) -> Any:
        """The GenAILogger, or its stand-in for the one in the sidecar: built on the tracking thread."""
        if self._log is None:
            self._log = genai_logger(self.experiment)
        return self._log

    def _prewarm(self) -> None:
        self._logger().prewarm(self.experiment.dataset)

    def on_search_end(self, study: SearchStudy) -> None:
        if self._sidecar is None:
            # In this process: waited for before it imports anything else (the plots import matplotlib,
            # which imports IPython when installed, as MLflow's harness does): two threads importing one
            # package at once can meet it partially initialised.
            self._wait_for_prewarm()

    def _wait_for_prewarm(self) -> None:
        if self._prewarmed is None:  # not started by on_search_start: queue it now
            self._prewarmed = self.tracking.in_background(self._prewarm)
        self._prewarmed.result()  # it registered the dataset splits (a done future answers at once)

    def on_validation_end(self, study: SearchStudy) -> None:
        if self._sidecar is None:
            # In this process the records finish before any recorder's on_result runs (the plots import
            # matplotlib; see on_search_end). A sidecar writes them while the plots are drawn.
            for job in self._logged.values():
                job.exception()

    def on_validation_batch(
        self, study: SearchStudy, *, label: str, instruction: str, rows: Sequence[EvaluationRow]
    ) -> None:
        # Each scored batch joins the prompt's batches kept so far: a run killed between two batches
        # leaves the first on disk, and its rerun, which finds them scored and asks them no more,
        # scores the rest here, so the prompt is recorded whole from the two runs' rows (_recover).
        part = self._part_file(study, label, instruction)
        earlier = _kept_rows(part) or ()
        asked = {r.query for r in rows}
        _keep_rows(part, [*(r for r in earlier if r.query not in asked), *rows])

    def on_validated(
        self, study: SearchStudy, *, label: str, instruction: str, rows: Sequence[EvaluationRow]
    ) -> None:
        # Kept on disk first: a run killed before MLflow has them is recorded from them by the rerun,
        # which finds the scores in the study and asks nothing again.
        kept = self._rows_file(study, label, instruction)
        _keep_rows(kept, rows)
        _drop_rows(self._part_file(study, label, instruction))  # whole now
        evaluation = self._evaluation(label, instruction, rows)
        self._logged[label] = self.tracking.in_background(
            self._record, evaluation, study.name, self.tracking.run_id, kept)

    def _evaluation(self, label: str, instruction: str, rows: Sequence[EvaluationRow]) -> PromptEvaluation:
        from opro.evaluation.rows import EvaluationReport
        from opro.judges.metrics import metric_name

        report = EvaluationReport(rows=tuple(rows), judge=metric_name(self.experiment.judge))
        return _validation_prompt(label, self.experiment.candidate_template(instruction), instruction, report)

    def _rows_file(self, study: SearchStudy, label: str, instruction: str) -> Path:
        key = hashlib.sha256("\0".join((study.name, label, instruction)).encode()).hexdigest()[:16]
        return self._rows_dir / f"{key}.json"

    def _part_file(self, study: SearchStudy, label: str, instruction: str) -> Path:
        full = self._rows_file(study, label, instruction)
        return full.with_name(full.stem + ".part.json")

    @property
    def _rows_dir(self) -> Path:
        from opro.paths import RunDir

        return RunDir(self.experiment.config.output_dir).validation_rows

    def _recover(self, study: SearchStudy, result: OptimizationResult,
                 recorded: dict[str, GenAIRecord | None]) -> None:
        """The validation prompts an earlier, killed run scored but MLflow lacks: written again from the
        answers kept on disk, and the ones whose answers were not kept named (their scores are in the
        study and summary.json)."""
        v, run_id = result.validation, self.tracking.run_id
        if v is None or run_id is None:
            return
        from opro.search.validation import validation_prompts

        answered = {label: ins for (label, ins), f in zip(
            validation_prompts(result.initial_instruction, [f.instruction for f in v.finalists])[1:], v.finalists,
            strict=True) if f.chosen or v.selection_questions}
        # How many questions each prompt answered in all: its rows are whole when the batches kept on
        # disk by the runs that scored them add up to it.
        asked = {label: v.selection_questions + (len(f.scores) if f.chosen else 0)
                 for label, f in zip([f"finalist {i}" for i in range(1, len(v.finalists) + 1)], v.finalists,
                                     strict=True)}
        if v.initial_scores:
            answered["initial"] = result.initial_instruction.strip()  # as the validation stage names it
            asked["initial"] = len(v.initial_scores)
        log = self._logger()
        rewritten, lost = [], []
        for label, ins in answered.items():
            if label in recorded:
                continue
            kept = self._rows_file(study, label, ins)
            if log.validation_recorded(label=label, optimization_run_id=run_id):
                _drop_rows(kept)  # written after all (the killed run's sidecar finished it)
                continue
            rows = _kept_rows(kept)
            if rows is None:
                rows = _kept_rows(self._part_file(study, label, ins))
                if rows is None or len(rows) < asked[label]:
                    lost.append(label)
                    continue
                _keep_rows(kept, rows)  # whole: recorded like a prompt one run scored
                _drop_rows(self._part_file(study, label, ins))
            recorded[label] = self._record(self._evaluation(label, ins, rows), study.name, run_id, kept)
            rewritten.append(label)
        if rewritten:
            logger.warning("MLflow lacked the validation evaluation run(s) of %s (an earlier run was stopped "
                           "before writing them): written again from the answers kept in %s",
                           ", ".join(rewritten), self._rows_dir)
        if lost:
            logger.warning("MLflow has no validation evaluation run for %s: an earlier run scored them and did not "
                           "record them (stopped first, or [tracking].genai was off) and their answers were not kept; "
                           "their scores are in the study and summary.json, without per-question traces",
                           ", ".join(lost))

    def _record(self, evaluation: PromptEvaluation, study_name: str, run_id: str | None,
                kept: Path | None = None) -> GenAIRecord | None:
        record: GenAIRecord | None = self._logger().log_validation(
            evaluation, dataset=self.experiment.dataset, study_name=study_name, optimization_run_id=run_id)
        if kept is not None:  # MLflow has them now
            _drop_rows(kept)
        return record

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        try:
            self._wait_for_prewarm()
            recorded = {label: job.result() for label, job in self._logged.items()}
            self._recover(study, result, recorded)
            log_validation_evaluations(result, recorded=recorded, log=self._logger())
        finally:
            self._release()

    def on_search_failed(self, study: SearchStudy, error: BaseException, *, abandoned: bool) -> None:
        # After ``tracking``'s, which drains the queued records first: what was sent is written.
        self._release()

    def _release(self) -> None:
        if self._sidecar is not None:
            self._sidecar.release()
            self._sidecar = None


def _keep_rows(path: Path, rows: Sequence[EvaluationRow]) -> None:
    """``rows`` as JSON at ``path`` (redacted, as every record is), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [{k: redact_text(v) if isinstance(v, str) else v for k, v in dataclasses.asdict(r).items()} for r in rows]
    for row in data:
        row["contexts"] = [redact_text(c) for c in row["contexts"]]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def _drop_rows(path: Path) -> None:
    """Delete the rows kept at ``path``, and their folder once it is empty."""
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


def _kept_rows(path: Path) -> tuple[EvaluationRow, ...] | None:
    """The rows :func:`_keep_rows` wrote at ``path`` (None: none kept, or unreadable)."""
    from opro.evaluation.rows import EvaluationRow

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return tuple(EvaluationRow(**{**r, "contexts": tuple(r["contexts"])}) for r in data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _validation_prompt(label: str, template: QATemplate, instruction: str, report: EvaluationReport) -> PromptEvaluation:
    role = "initial" if label == "initial" else "finalist"
    return PromptEvaluation(label=label, template=template, report=report,
                            tags={"opro.role": role, "opro.instruction": instruction[:5000]})


def log_validation_evaluations(
    result: OptimizationResult,
    *,
    recorded: Mapping[str, GenAIRecord | None],
    log: GenAILogger,
) -> GenAIRecord | None:
    """The validation stage's evaluation runs, recorded while it ran (``recorded``, by label), with
    the returned finalist tagged ``opro.role = returned finalist``; one record over all of them.

    A prompt is recorded from the rows its scoring made, never by asking again: one whose questions
    a rerun found already scored was recorded by the run that scored them (or, if that run died
    first, is not recorded; its scores are in the study)."""
    v = result.validation
    if v is None:
        return None
    from opro.search.validation import validation_prompts

    records = []
    for label, instruction in validation_prompts(result.initial_instruction, [f.instruction for f in v.finalists]):
        record = recorded.get(label)
        if record is None:
            continue
        if v.winner is not None and instruction == v.winner.instruction:
            log.set_run_tag(record.runs[0].run_id, "opro.role", "returned finalist")
        records.append(record)
    if not records:
        return None
    # Every prompt's run is on the same dataset (the validation split): its name and id come with them.
    return dataclasses.replace(records[0], runs=tuple(run for r in records for run in r.runs))


__all__ = ["ValidationTraces", "log_validation_evaluations"]
