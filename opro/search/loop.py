"""The search: steps of propose -> score -> record, then the validation stage.

:class:`Search` takes its collaborators (a proposer, a scorer, an open study, the recorders) and
its settings; the program, the judge and the template live in the scorer, the study store and the
fingerprint check with whoever opened the study (:class:`opro.experiment.Experiment`).

Resume: proposals are stored in the study before they are evaluated and finished trials are read
back on start, so re-running an interrupted search re-evaluates nothing that finished and the
call cache makes the replay of a half-evaluated candidate free.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opro.errors import ConfigError, OproError
from opro.evaluation.batch import QAExample
from opro.evaluation.rows import EvaluationRow
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.llm.client import UsageLedger
from opro.locking import StudyLease
from opro.search.ledger import DecisionLedger
from opro.search.metaprompt import Exemplar
from opro.search.proposers.base import ProposalContext, Proposer
from opro.search.records import Recorder
from opro.search.results import CandidateRecord, OptimizationResult, ValidationResult
from opro.search.scoring import CandidateScorer
from opro.search.settings import SearchSettings
from opro.search.steps import StepEvaluator
from opro.search.study import SearchStudy
from opro.search.validation import validate
from opro.search.workers import Coordinator, UsageBook, WorkerPlan
from opro.stats.sequential import on_scale

logger = logging.getLogger(__name__)

#: Steps in a row whose samples were all rejected (repeats, invalid) before the search stops.
_MAX_STEPS_WITHOUT_CANDIDATES = 3


@dataclass
class _Progress:
    """How the steps so far went, for the stopping rules: the best step score, and the steps in a row
    without a better one or without a new candidate."""

    best: float = -math.inf
    without_gain: int = 0
    without_candidates: int = 0

    def scored(self, step: int, history: Sequence[CandidateRecord]) -> None:
        step_best = max(
            (r.score for r in history if r.step == step and r.status == "complete" and r.score is not None),
            default=-math.inf,
        )
        if step_best > self.best + 1e-9:
            self.best = step_best
            self.without_gain = 0
        elif step > 0:
            self.without_gain += 1


class Search:
    """An OPRO search over one study. Collaborators and settings here; the questions in :meth:`run`."""

    def __init__(
        self,
        proposer: Proposer,
        scorer: CandidateScorer,
        study: SearchStudy,
        settings: SearchSettings,
        *,
        usage: UsageLedger,
        workers: WorkerPlan | None = None,
        recorders: Sequence[Recorder] = (),
        seed: int = 0,
        progress: bool = True,
        ledger: DecisionLedger | None = None,
    ) -> None:
        self.proposer = proposer
        self.scorer = scorer
        self.study = study
        self.settings = settings
        self.workers = workers or WorkerPlan.solo()
        #: What the search leaves behind (run directory, MLflow, ...), called in this order.
        self.recorders = tuple(recorders)
        self.seed = seed
        self.progress = progress
        #: The user's decision ledger: the validation decision is checked against and
        #: recorded in it, across output folders and study stores.
        self.ledger = ledger
        #: Task + judge calls a call budget keeps back for the validation stage (set by :meth:`run`).
        self.validation_reserve = 0
        self.usage = UsageBook(study, usage, worker=self.workers.index)
        self.coordinator = Coordinator(study, self.workers, self.usage)
        self.steps = StepEvaluator(study=study, scorer=scorer, settings=self.settings, coordinator=self.coordinator,
                                   usage=self.usage, budget_left=self.budget_left, progress=progress)

    def budget_left(self, need: int = 1) -> bool:
        """Whether ``need`` more calls fit the budget with the validation stage's share kept back
        (``max_calls`` and ``max_tokens_budget`` cover the whole run). Tokens are counted ahead at
        the mean tokens per call so far."""
        s = self.settings
        usage = self.usage.total()
        calls = sum(int(u.get("calls", 0)) for u in usage.values())
        tokens = sum(int(u.get("prompt_tokens", 0)) + int(u.get("completion_tokens", 0)) for u in usage.values())
        ahead = max(1, need) + self.validation_reserve
        if s.max_calls and calls + ahead > s.max_calls:
            return False
        per_call = tokens / calls if calls else 0.0
        return not (s.max_tokens_budget and tokens + ahead * per_call > s.max_tokens_budget)

    def run(
        self,
        *,
        initial: Sequence[str],
        optimization_set: Sequence[QAExample],
        exemplar_set: Sequence[QAExample] = (),
        validation_set: Sequence[QAExample] = (),
        extension_set: Sequence[QAExample] = (),
        pooled: int = 0,
    ) -> OptimizationResult:
        """Search on ``optimization_set``; then re-score the finalists on ``validation_set`` (and, when
        its looks do not decide, on up to ``[optimizer].validation_extension`` of ``extension_set``:
        questions in no split, never held-out; its last ``pooled`` from the dataset's labelled pool).

        The returned instruction is a finalist only if it beats the initial instruction on the
        validation questions (a group-sequential paired test; see :mod:`opro.search.validation`);
        otherwise it is the initial instruction.
        """
        if not optimization_set:
            raise OproError("the optimization split is empty: give the dataset an optimization split")
        if not initial:
            raise OproError("give at least one initial instruction")
        if self.settings.validation.finalists > 0 and not validation_set:
            raise ConfigError(
                f"[optimizer].finalists = {self.settings.validation.finalists} needs validation questions, but the validation "
                "split is empty: set [data.split].validation (e.g. 8; more questions detect smaller gains), "
                "or set [optimizer].finalists = 0 to skip validation (then no gain is claimed)"
            )
        from opro.search.validation_sizes import max_calls

        self.validation_reserve = max_calls(self.settings.validation, len(validation_set), len(extension_set))
        cap = self.settings.max_calls
        if cap and cap < self.validation_reserve + 2 * len(initial):
            raise ConfigError(
                f"[optimizer].max_calls = {cap} covers the whole run, and the validation stage can take "
                f"{self.validation_reserve} task + judge calls ({len(validation_set)} questions"
                + (f" and up to {min(len(extension_set), self.settings.validation.validation_extension)} extension questions"
                   if extension_set and self.settings.validation.validation_extension else "")
                + f", {self.settings.validation.finalists} finalist(s)): raise max_calls above {self.validation_reserve} "
                "(`opro plan` shows the split), or lower [data.split].validation "
                "or [optimizer].validation_extension")
        if self.workers.lead:
            from opro.search.validation import refuse_seen

            refuse_seen(study=self.study, settings=self.settings.validation, validation_set=validation_set, ledger=self.ledger)
        started = time.perf_counter()
        plan = self.workers
        # One process per (study, worker index), wherever it runs: a second one would mark the
        # first's running trials failed and evaluate everything twice.
        worker = f" as worker {plan.index}/{plan.count}" if plan.count > 1 else ""
        lease = StudyLease(self.study.lease_slot(plan.index), what=f"study {self.study.name!r}{worker}",
                           info={"of": plan.count})
        with lease:
            self.coordinator.token = lease.token
            self.coordinator.check_workers()
            return self._run(initial=initial, optimization_set=optimization_set, exemplar_set=exemplar_set,
                             validation_set=validation_set, extension_set=extension_set, started=started,
                             pooled=pooled)

    def _propose(self, step: int, history: Sequence[CandidateRecord], exemplars: Sequence[Exemplar],
                 n_questions: int) -> list[str]:
        stored = self.study.view().proposals(step)
        if stored is not None:
            return stored
        context = ProposalContext(
            step=step, history=tuple(history), k=self.settings.candidates_per_step, n_questions=n_questions,
            exemplars=tuple(exemplars), scorer=self.scorer,
            sample=lambda prompt, indices: self.coordinator.shared_samples(step, prompt, indices, self.proposer.ask),
            on_prompt=functools.partial(self._on_prompt, step),
        )
        proposal = self.proposer.propose(context)
        # The other dimensions of each new candidate, from Optuna's sampler over the scored history.
        space = self.scorer.space
        params = space.sample(history, len(proposal.accepted), step=step) if space is not None else []
        self.study.save_proposals(step, proposal.accepted, proposal.rejected, params=params)
        return list(proposal.accepted)

    def _configure(self, step: int, proposals: Sequence[str]) -> list[str]:
        """Tell the scorer the stored values of the step's candidates (step 0: the initial
        configuration's, then the first moves', written by every worker alike); their names."""
        space = self.scorer.space
        if space is None:
            return list(proposals)
        stored = self.study.view().params(step)
        if step == 0 and len(stored) != len(proposals):
            first = space.first_moves()
            stored = [dict(space.initial) for _ in proposals[: len(proposals) - len(first)]] + first
            self.study.save_params(0, stored)
        return [self.scorer.configure(instruction, stored[i] if i < len(stored) else {})
                for i, instruction in enumerate(proposals)]

    def _on_prompt(self, step: int, text: str) -> None:
        for recorder in self.recorders:
            recorder.on_meta_prompt(step=step, text=text)

    def _on_validated(self, label: str, instruction: str, rows: Sequence[EvaluationRow]) -> None:
        for recorder in self.recorders:
            recorder.on_validated(self.study, label=label, instruction=instruction, rows=rows)

    def _on_validation_batch(self, label: str, instruction: str, rows: Sequence[EvaluationRow]) -> None:
        for recorder in self.recorders:
            recorder.on_validation_batch(self.study, label=label, instruction=instruction, rows=rows)

    def _run(
        self,
        *,
        initial: Sequence[str],
        optimization_set: Sequence[QAExample],
        exemplar_set: Sequence[QAExample],
        validation_set: Sequence[QAExample],
        extension_set: Sequence[QAExample],
        started: float,
        pooled: int = 0,
    ) -> OptimizationResult:
        study, lead = self.study, self.workers.lead
        history = self._resume()
        exemplar_pool = [Exemplar(e.query, e.reference_answer) for e in exemplar_set]
        try:
            stopped = self._search_steps(initial=initial, optimization_set=optimization_set,
                                         exemplar_pool=exemplar_pool, history=history)
            history = study.records()
            self.usage.load_others()
            for recorder in self.recorders:
                recorder.on_search_end(study)
            validation = None
            if lead and self.settings.validation.finalists > 0:
                validation = validate(
                    study=study, scorer=self.scorer, settings=self.settings.validation, validation_set=validation_set,
                    history=history, initial=initial[0].strip(), extension_set=extension_set, seed=self.seed,
                    progress=self.progress, ledger=self.ledger, pooled=pooled,
                    on_validated=self._on_validated, on_batch=self._on_validation_batch,
                )
            if lead:
                for recorder in self.recorders:
                    recorder.on_validation_end(study)
            result = self._result(history, stopped=stopped, wall_s=time.perf_counter() - started,
                                  initial=initial[0], validation=validation)
            self.scorer.close()
        except BaseException as exc:
            self.scorer.close()
            with contextlib.suppress(Exception):  # the study store may be what failed
                self.usage.save()
            for recorder in self.recorders:
                recorder.on_search_failed(study, exc, abandoned=self.coordinator.abandoned)
            raise
        self.usage.save()
        if lead:
            self._hand_over(result)
        return result

    def _resume(self) -> list[CandidateRecord]:
        """Pick up where an earlier run of this worker stopped: its usage, its interrupted trials failed
        (to be re-run), the finished candidates (returned) configured in the scorer; tell the recorders."""
        self.usage.load()
        self.study.fail_running(self.workers.index)
        history = self.study.records()
        for r in history:
            self.scorer.configure(r.instruction, r.params, name=r.name)
        for recorder in self.recorders:
            recorder.on_search_start(self.study, lead=self.workers.lead)
        return history

    def _search_steps(self, *, initial: Sequence[str], optimization_set: Sequence[QAExample],
                      exemplar_pool: Sequence[Exemplar], history: list[CandidateRecord]) -> str:
        """Step 0 (the initial instructions), then propose -> score -> record until a step stops the
        search; returns why it stopped (``steps`` when all were run)."""
        progress = _Progress()
        for step in range(self.settings.steps + 1):
            self.usage.load_others()
            proposals, stopped = self._proposals(step, initial=initial, optimization_set=optimization_set,
                                                 exemplar_pool=exemplar_pool, history=history)
            if proposals is None:
                return stopped
            names = self._configure(step, proposals)
            self.steps.evaluate(step, names, optimization_set)
            history = self.study.records()
            progress.scored(step, history)
            if self.workers.lead:
                for recorder in self.recorders:
                    recorder.on_step(self.study, step=step, history=history, best_score=progress.best)
            reason = self._stop_after(step, history=history, proposals=proposals, progress=progress)
            if reason is not None:
                return reason
        return "steps"

    def _proposals(self, step: int, *, initial: Sequence[str], optimization_set: Sequence[QAExample],
                   exemplar_pool: Sequence[Exemplar], history: Sequence[CandidateRecord]) -> tuple[list[str] | None, str]:
        """The step's candidate instructions; or None and why the search stops before the step. Step 0:
        the initial instructions, then the first of them once per first move of the search space
        (:meth:`opro.search.space.SearchSpace.first_moves`: :meth:`_configure` gives them their values)."""
        if step == 0:
            initials = list(dict.fromkeys(i.strip() for i in initial if i.strip()))
            space = self.scorer.space
            moves = space.first_moves() if space is not None and initials else []
            return initials + initials[:1] * len(moves), ""
        if self.workers.lead:
            # Room for the step's optimizer samples (up to 3 per candidate) and its first minibatch.
            k = self.settings.candidates_per_step
            if not self.budget_left(3 * k + 2 * k * min(self.settings.minibatch_size, len(optimization_set))):
                return None, self.coordinator.stop(step, "budget")
            return self._propose(step, history, exemplar_pool, len(optimization_set)), ""
        proposals = self.coordinator.await_proposals(step, self.proposer.ask)
        if proposals is None:  # worker 0 stopped the search (its budget, or no new candidates)
            return None, self.coordinator.stopped_reason(step)
        return proposals, ""

    def _stop_after(self, step: int, *, history: Sequence[CandidateRecord], proposals: Sequence[str],
                    progress: _Progress) -> str | None:
        """Why the search stops after ``step`` (the budget, patience, no new candidates), or None."""
        lead, coord = self.workers.lead, self.coordinator
        if any(r.status == "budget" and r.step == step for r in history):
            return "budget"
        if lead and not self.budget_left():
            # Only worker 0 decides from the usage totals (each worker's view of them lags);
            # the others read its decision from the study.
            return coord.stop(step + 1, "budget")
        if self.settings.patience and progress.without_gain >= self.settings.patience:
            return "patience"
        # An optimizer that only repeats earlier instructions would otherwise be asked again
        # for every remaining step (however many were configured), evaluating nothing.
        progress.without_candidates = progress.without_candidates + 1 if step > 0 and not proposals else 0
        if lead and progress.without_candidates >= _MAX_STEPS_WITHOUT_CANDIDATES:
            stopped = coord.stop(step + 1, "no new candidates")
            logger.warning(
                "stopping after step %d: the optimizer proposed no new instruction in %d steps in a row "
                "(every sample repeated an earlier one or was invalid; see the rejected samples); a higher "
                "[optimizer].temperature gives more varied samples", step, progress.without_candidates,
            )
            return stopped
        return None

    def _hand_over(self, result: OptimizationResult) -> None:
        """The lead's result to the recorders, with a warning when no proposal was usable."""
        if result.rejected and not any(r.step > 0 for r in result.history):
            reasons = sorted({r["reason"] for r in result.rejected})
            logger.warning(
                "the optimizer proposed no usable instruction: %d proposal(s) rejected (%s)",
                len(result.rejected), "; ".join(reasons),
            )
        for recorder in self.recorders:
            recorder.on_result(self.study, result)

    def _result(
        self,
        history: list[CandidateRecord],
        *,
        stopped: str,
        wall_s: float,
        initial: str,
        validation: ValidationResult | None,
    ) -> OptimizationResult:
        complete = [r for r in history if r.status == "complete" and r.score is not None]
        if not complete:
            invalid, errors = sum(r.n_invalid for r in history), sum(r.n_errors for r in history)
            raise OproError(
                f"no candidate was scored: {invalid} judge replies were unreadable and {errors} calls failed "
                f"over {len(history)} candidate(s); check the judge model, its endpoint and the logs, then rerun "
                "the same command: the answers are kept, and candidates that failed for either reason are "
                "evaluated again"
            )
        initial = initial.strip()
        initial_rec = next((r for r in history if r.step == 0 and r.name == initial), None)
        common = {
            "initial_instruction": initial,
            "initial_score": initial_rec.score if initial_rec else None,
            "history": tuple(history),
            "usage": self.usage.total(),
            "stopped_reason": stopped,
            "study_name": self.study.name,
            "wall_s": wall_s,
            "validation": validation,
            "rejected": self.study.rejections(),
            "objective": self.settings.claim.objective,
        }
        if validation is not None and not validation.finalists and initial_rec is not None:
            # Nothing to validate: the initial instruction, on the search score it has (validation
            # questions would only measure it, at a cost, and decide nothing).
            return OptimizationResult(
                best_score=float(initial_rec.score),  # type: ignore[arg-type]
                score_basis="search",
                best_search_score=initial_rec.score,
                **self._returned(initial), **common,  # type: ignore[arg-type]
            )
        if validation is None:
            # No validation stage: the search's arg-max, labelled as the in-sample score it is.
            best = max(complete, key=lambda r: (r.score, -r.step, -r.index))
            return OptimizationResult(
                best_score=float(best.score),  # type: ignore[arg-type]
                score_basis="search",
                best_search_score=best.score,
                **self._returned(best.name), **common,  # type: ignore[arg-type]
            )
        w = validation.winner
        instruction = w.instruction if w is not None else initial
        search: float | None
        score: float | None
        if w is not None and w.difference is not None and validation.initial_score is not None:
            # The initial instruction's confirmation mean (never selected on) plus the adjusted gain.
            score, search = validation.initial_score + w.difference, w.search_score
            score_ci = _shifted(validation.initial_score, validation.initial_ci, w.difference, w.difference_ci)
        else:
            score, score_ci = validation.initial_score, validation.initial_ci
            search = initial_rec.score if initial_rec else None
        if score is None:
            raise OproError(
                f"no validation question was scored validly for the initial instruction ({validation.n_questions} "
                "asked): check the judge model and the logs, then rerun (finished work is kept)"
            )
        return OptimizationResult(
            **self._returned(instruction),  # type: ignore[arg-type]
            best_score=float(score),
            score_basis="validation",
            best_score_ci=score_ci,
            best_search_score=search,
            gain=None if w is None else w.difference,
            gain_ci=None if w is None else w.difference_ci,
            **common,  # type: ignore[arg-type]
        )

    def _returned(self, name: str) -> dict[str, Any]:
        """The returned candidate's fields (by its name): its instruction, template and whole configuration."""
        template = self.scorer.template(name)
        return {"best_instruction": self.scorer.instruction_of(name), "best_name": name,
                "best_template": template.template_text,
                "best_configuration": template.to_json() if hasattr(template, "to_json") else {},
                "best_params": self.scorer.params_of(name)}


def _shifted(base: float, base_ci: tuple[float, float] | None, gain: float,
             gain_ci: tuple[float, float] | None) -> tuple[float, float] | None:
    """An interval for ``base + gain`` from the two intervals, half-widths added in quadrature."""
    if base_ci is None or gain_ci is None:
        return None
    h = (base_ci[1] - base_ci[0]) / 2
    return on_scale((base + gain - math.hypot(gain - gain_ci[0], h), base + gain + math.hypot(gain_ci[1] - gain, h)),
                    SCORE_MIN, SCORE_MAX)


__all__ = ["Search"]
