"""One step of the search: the step's candidates claimed, scored in lockstep minibatches, recorded.

Candidates of a step are evaluated question-major, in minibatches, so that (a) the running mean of
every candidate is reported after each minibatch and the pruner can stop clearly worse ones, and
(b) consecutive task calls share the retrieved context, which a llama.cpp backend reuses as a KV
prefix when the instruction sits after the query. With several workers, candidates are claimed one
by one whenever a slot would idle, and a step with fewer candidates than workers is shared question
by question (its candidates split into parts).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import optuna

from opro.errors import LLMError, OproError
from opro.evaluation.batch import QAExample
from opro.evaluation.engine import Gate, Pair, Scored
from opro.program.cost import CallUsage, CostModel
from opro.progress import ProgressBar, progress_bar
from opro.search.pruners import EarlierStepsPruner, RunningCandidate
from opro.search.results import CandidateRecord, CandidateStatus
from opro.search.scoring import CandidateScorer, Outcome, Template
from opro.search.settings import SearchSettings
from opro.search.study import SearchStudy
from opro.search.trials import CandidateTrial, complete_before
from opro.search.workers import (
    MAX_POLL_S,
    Coordinator,
    UsageBook,
    claim,
    describe_lease,
    part_key,
    part_state,
    release_stale,
    step_state,
)

logger = logging.getLogger(__name__)

#: A part's outcome of a call that failed, as stored in the study ("error") and read back.
_PART_ERROR = "error"

Claimed = tuple[int, str, optuna.trial.Trial]


def _part_outcome(value: Any) -> Outcome:
    if value == _PART_ERROR:
        return LLMError("a call of this question failed on the worker that evaluated it")
    return None if value is None else float(value)


@dataclass
class _Part:
    """Questions ``lo``..``hi`` of a split candidate (whoever owns it), claimed by this worker."""

    index: int
    part: int
    lo: int
    hi: int
    instruction: str
    template: Template
    trial: optuna.trial.Trial
    got: dict[int, Outcome] = field(default_factory=dict)
    #: Each answered question's task call (its cost), by question index.
    usage: dict[int, CallUsage] = field(default_factory=dict)
    lost: bool = False


@dataclass
class _Live:
    """A candidate being evaluated in the current step (``instruction``: its name)."""

    instruction: str
    trial: optuna.trial.Trial
    template: Template
    index: int = 0
    #: Another worker took this candidate over (this one's heartbeat was missed): its results are dropped.
    lost: bool = False
    #: Results by question index as they arrive (a score, None for an invalid judgment, or the error).
    got: dict[int, Outcome] = field(default_factory=dict)
    #: Each answered question's task call (its cost), by question index.
    usage: dict[int, CallUsage] = field(default_factory=dict)
    #: Minibatches whose running mean was reported (the prefix of questions in ``scores``).
    reported: int = 0
    #: Running mean after each reported minibatch (what the study's intermediate values will hold).
    means: dict[int, float] = field(default_factory=dict)
    scores: list[float | None] = field(default_factory=list)
    n_errors: int = 0
    status: CandidateStatus = "complete"
    #: Questions per part when the candidate is split among the workers (0: this worker asks them all).
    split: int = 0

    def mean(self) -> float | None:
        valid = [s for s in self.scores if s is not None]
        return sum(valid) / len(valid) if valid else None

    def costs(self, model: CostModel) -> list[float | None]:
        """Each reported question's cost (None: its call failed), in the order of ``scores``."""
        return [None if (u := self.usage.get(i)) is None else model.of_call(u) for i in range(len(self.scores))]

    def n_valid(self) -> int:
        return sum(1 for s in self.scores if s is not None)


def pruning(study: SearchStudy, step: int) -> tuple[EarlierStepsPruner, list[CandidateTrial]] | None:
    """The pruner that can stop a candidate in this step, with the complete candidates of earlier
    steps it compares with (fixed while the step runs: a step starts once the one before it is
    done), or None: no pruner, or nothing to compare with, so minibatches need not wait for the
    running mean."""
    pruner = study.optuna.pruner
    if isinstance(pruner, optuna.pruners.NopPruner):
        return None
    if not isinstance(pruner, EarlierStepsPruner):
        raise TypeError(f"opro's search needs an EarlierStepsPruner, got {type(pruner).__name__}")
    earlier = complete_before(study.optuna, step)
    return (pruner, earlier) if earlier else None


class StepEvaluator:
    """Claims and scores the candidates of each step for this worker, and records them in the study."""

    def __init__(
        self,
        *,
        study: SearchStudy,
        scorer: CandidateScorer,
        settings: SearchSettings,
        coordinator: Coordinator,
        usage: UsageBook,
        budget_left: Callable[[int], bool],
        progress: bool = True,
    ) -> None:
        self.study = study
        self.scorer = scorer
        self.settings = settings
        self.coordinator = coordinator
        self.usage = usage
        self.budget_left = budget_left
        self.progress = progress

    @property
    def worker(self) -> int:
        return self.coordinator.plan.index

    @property
    def budgeted(self) -> bool:
        """A call or token budget is set: minibatches then start in order, each after a budget check."""
        return bool(self.settings.max_calls or self.settings.max_tokens_budget)

    def _claim(self, step: int, items: Sequence[tuple[int, str]], *, part: str | None = None) -> list[Claimed]:
        return claim(self.study, step=step, items=items, token=self.coordinator.token, worker=self.worker, part=part,
                     scorer=self.scorer)

    def evaluate(self, step: int, proposals: Sequence[str], examples: Sequence[QAExample]) -> list[CandidateRecord]:
        """Claim and evaluate the candidates of ``step`` (by name, each configured in the scorer) until
        every proposal has a result, by this worker or another; claims of stopped workers are taken
        over. Returns this worker's new records."""
        n = len(proposals)
        mine: list[CandidateRecord] = []
        poll, last_note = 0.05, time.monotonic()
        # Only earlier steps decide pruning, so whether this step can prune is known before it starts.
        can_prune = pruning(self.study, step) is not None
        # A step that cannot prune (step 0, or the pruner off) with fewer candidates than workers is
        # shared question by question: its candidates are split into parts, claimed one at a time
        # (by the number of workers the study was started for: the others may not have started yet).
        at = _Step(number=step, proposals=proposals, examples=examples, can_prune=can_prune,
                   splittable=not self.budgeted and not can_prune,
                   part_size=max(self.settings.minibatch_size, math.ceil(len(examples) / 8)))
        while True:
            state = step_state(self.study, step, proposals)
            if release_stale(self.study, state):
                continue
            free = state.free(n)
            if free:
                new = self._take(at, free)
                if new is not None:
                    mine.extend(new)
                    _refuse_a_broken_step(step, new)
                    poll = 0.05
                continue
            if len(state.done) >= n:
                return mine
            if at.splittable and part_state(self.study, step, proposals).free(len(examples)):
                # Every candidate is taken, but a split one has parts left: help with those.
                _StepRun(self, step, [], examples, proposals=proposals).run()
                poll = 0.05
                continue
            last_note = self._note_waiting(step, state.claimed.values(), last_note)
            time.sleep(poll)
            poll = min(MAX_POLL_S, poll * 1.5)

    def _take(self, at: _Step, free: list[int]) -> list[CandidateRecord] | None:
        """Claim this worker's share of the ``free`` candidates and score them (with other workers,
        claiming more on the way); their records, or None when another worker won every claim."""
        # With other workers: first as many candidates as keep this worker's slots busy, then
        # one more whenever a slot would idle (a pruned candidate, a minibatch waiting for
        # its last judgment), so workers whose candidates end early take more of the step.
        # Each starts at its own place in the free list, so that workers rarely reach for the
        # same candidates. Alone (or with a budget, which checks minibatches in order) it
        # takes its even share at once.
        examples, proposals = at.examples, at.proposals
        workers = max(1, len(self.coordinator.live_workers()))
        share = max(1, math.ceil(len(proposals) / workers))
        refill = workers > 1 and not self.budgeted
        if refill:
            width = min(len(examples), self.settings.minibatch_size) if at.can_prune else len(examples)
            share = min(share, math.ceil(self.scorer.engine.task_slots / max(1, width)) + 1)
        start = (self.worker * share) % len(free)
        take = sorted((free[start:] + free[:start])[:share])
        won = self._split(at, self._claim(at.number, [(i, proposals[i]) for i in take]))
        if not won:
            return None
        run = _StepRun(self, at.number, won, examples, claim_next=functools.partial(self._claim_next, at) if refill else None,
                       proposals=proposals if at.splittable else None)
        return run.run()

    def _claim_next(self, at: _Step) -> list[Claimed]:
        """Claim one more free candidate of the step (a slot would idle); none left: empty."""
        while True:
            state = step_state(self.study, at.number, at.proposals)
            free = state.free(len(at.proposals))
            if not free:
                return []
            i = free[self.worker % len(free)]
            got = self._claim(at.number, [(i, at.proposals[i])])
            if got:
                return self._split(at, got)

    def _split(self, at: _Step, won: list[Claimed]) -> list[Claimed]:
        """``won``, marked to be split among the workers where the step has fewer candidates than workers."""
        if at.splittable and len(at.proposals) < max(self.coordinator.plan.count, len(self.coordinator.live_workers())):
            for _, _, trial in won:
                self.study.mark_split(trial, at.part_size)
        return won

    def _note_waiting(self, step: int, claimed: Iterable[CandidateTrial], last_note: float) -> float:
        """Every 30 s of waiting, say which workers the step waits for; when it was last said."""
        now = time.monotonic()
        if now - last_note <= 30:
            return last_note
        view = self.study.view()
        claims = list(claimed)
        who = sorted({t.worker for t in claims})
        logger.warning(
            "worker %d: step %d waits for %d candidate(s) of %s", self.worker, step, len(claims),
            ", ".join(describe_lease(w, view.lease(w), now=time.time()) for w in who),
        )
        return now


@dataclass(frozen=True)
class _Step:
    """A step as this worker evaluates it: what can be pruned or split, and how."""

    number: int
    proposals: Sequence[str]
    examples: Sequence[QAExample]
    #: A pruner can stop candidates of this step (earlier steps have complete candidates to compare with).
    can_prune: bool
    #: Its candidates may be split into parts among the workers (no pruning, no budget).
    splittable: bool
    #: Questions per part of a split candidate.
    part_size: int


def _refuse_a_broken_step(step: int, new: Sequence[CandidateRecord]) -> None:
    """Stop the search when every candidate this worker scored in the step failed on every call (the
    endpoint is down) or got only unreadable judge replies (the judge is broken): not the candidates."""
    if new and all(r.status == "failed" and r.n_errors for r in new):
        # The endpoint is down, not the candidates bad: stop before paying for more.
        raise OproError(
            f"every call of step {step} failed ({sum(r.n_errors for r in new)} errors; see the "
            "warnings above): fix the endpoint and rerun the same command; finished work is kept "
            "and the failed candidates are evaluated again"
        )
    if new and all(r.n_scored == 0 and r.n_invalid for r in new):
        # The judge is broken, not the candidates: a next step proposed from a history
        # without a score would differ from the one a working judge leads to.
        raise OproError(
            f"every judge reply of step {step} was unreadable ({sum(r.n_invalid for r in new)} "
            "replies; see the warnings above): fix the judge (its model, endpoint, template or "
            "[judge].max_tokens) and rerun the same command; the answers are kept and these "
            "candidates are judged again"
        )


class _StepRun:
    """The candidates one worker claimed in a step (and those it claims on the way), scored.

    ``claim_next`` claims another candidate whenever a slot would idle. With ``proposals`` (a step
    whose candidates may be split), parts of split candidates are claimed too, whoever owns them, and
    this worker's own split candidates are finished once all their parts are in."""

    def __init__(
        self,
        owner: StepEvaluator,
        step: int,
        claimed: Sequence[Claimed],
        examples: Sequence[QAExample],
        *,
        claim_next: Callable[[], list[Claimed]] | None = None,
        proposals: Sequence[str] | None = None,
    ) -> None:
        self.owner = owner
        self.study = owner.study
        self.step = step
        self.examples = examples
        self.claim_next = claim_next
        self.proposals = proposals
        self.live = [self._candidate(idx, instruction, trial) for idx, instruction, trial in claimed]
        self.jobs: list[_Part] = []
        self.n, self.size = len(examples), owner.settings.minibatch_size
        self.n_batches = max(1, math.ceil(self.n / self.size))
        self.pruning = pruning(self.study, step)
        #: Under an objective that lowers an amount per answer (cost), each question's cost is kept
        #: beside its score (what that race pairs on).
        self.keeps_costs = owner.settings.claim.objective.non_inferiority
        # With a budget, minibatch b starts only once minibatch b-1 is finished and the budget is
        # checked, as a plain loop would: where a run stops must not depend on timing.
        self.budgeted = owner.budgeted
        self.budget_checked: set[int] = set()
        self.reports: list[Future[None]] = []
        self.bar: ProgressBar | None = None
        self.bookkeeper: ThreadPoolExecutor | None = None

    def _candidate(self, idx: int, instruction: str, trial: optuna.trial.Trial) -> _Live:
        # Its claim says whether it is split (only where a step may split: a storage read).
        split = self.study.split_size(trial) if self.proposals is not None else 0
        return _Live(instruction, trial, template=self.owner.scorer.template(instruction), index=idx, split=split)

    # -- the engine's callbacks --------------------------------------------------------------------
    def _batch_done(self, b: int) -> bool:
        lo, hi = b * self.size, min(self.n, (b + 1) * self.size)
        return all(all(i in c.got for i in range(lo, hi)) for c in self.live if c.status == "complete")

    def gate(self, pair: Pair) -> Gate:
        if isinstance(pair.key, tuple):  # a part: never pruned (split steps cannot prune)
            return "drop" if self.jobs[pair.key[1]].lost else "run"
        c = self.live[int(pair.key)]  # type: ignore[call-overload]
        if c.status != "complete" or c.lost:
            return "drop"  # pruned, out of budget or taken over: its queued questions are never asked
        b = pair.index // self.size
        if self.budgeted and b not in self.budget_checked:
            if b > 0 and not self._batch_done(b - 1):
                return "hold"
            self.budget_checked.add(b)
            # The whole minibatch must fit (every live candidate's task and judge calls on it), so
            # the budget is a cap, not a point after which one more minibatch still runs.
            going = sum(1 for c in self.live if c.status == "complete" and not c.lost)
            asks = min(self.n, (b + 1) * self.size) - b * self.size
            if not self.owner.budget_left(2 * going * asks):
                for other in self.live:
                    if other.status == "complete":
                        other.status = "budget"
                return "drop"
        # A candidate that may be pruned after minibatch b-1 waits for that decision; with
        # lookahead its next minibatch is answered meanwhile on task slots that would idle (its
        # judgments wait for the decision), so its minibatches do not run answer-then-judge in
        # series. Scores and decisions are the same; a pruned candidate may have cost the answers
        # of one more minibatch.
        if self.pruning is not None and c.reported < b:
            ahead = self.owner.settings.lookahead and not self.budgeted and c.reported == b - 1
            return "spare" if ahead else "hold"
        return "run"

    def on_scored(self, scored: Scored) -> None:
        assert self.bar is not None and self.bookkeeper is not None
        if isinstance(scored.pair.key, tuple):
            job = self.jobs[scored.pair.key[1]]
            if job.lost:
                return
            self.bar.advance()
            job.got[scored.pair.index] = CandidateScorer.outcome(scored, job.instruction)
            if scored.error is None:
                job.usage[scored.pair.index] = CallUsage.of(scored.row)
            if len(job.got) == job.hi - job.lo:
                self.reports.append(self.bookkeeper.submit(self._finish_part, job))
            return
        c = self.live[int(scored.pair.key)]  # type: ignore[call-overload]
        if c.status != "complete" or c.lost:
            return
        self.bar.advance()
        c.got[scored.pair.index] = CandidateScorer.outcome(scored, c.instruction)
        if scored.error is None:
            c.usage[scored.pair.index] = CallUsage.of(scored.row)
        self._report_ready(c)

    def _report_ready(self, c: _Live) -> None:
        """Report every minibatch whose questions are all in, in order."""
        assert self.bar is not None and self.bookkeeper is not None
        n, size = self.n, self.size
        while c.reported < self.n_batches and c.status == "complete":
            b = c.reported
            hi = min(n, (b + 1) * size)
            if any(i not in c.got for i in range(b * size, hi)):
                break
            results = [c.got[i] for i in range(b * size, hi)]
            c.n_errors += sum(1 for r in results if isinstance(r, LLMError))
            c.scores.extend(None if isinstance(r, LLMError) else r for r in results)
            c.reported += 1
            mean = c.mean()
            if mean is None:
                continue
            c.means[b] = mean
            # The decision is made here from the candidate's own results and the earlier
            # steps (the pruner's whole input), so nobody waits for the storage write: it
            # runs beside the requests, in order, on the bookkeeping thread.
            costs = c.costs(self.owner.scorer.cost) if self.keeps_costs else None
            self.reports.append(self.bookkeeper.submit(
                self._report, c, mean, b, list(c.scores) if self.pruning is not None else None,
                costs if self.pruning is not None else None))
            if self.pruning is None or b + 1 >= self.n_batches:
                continue
            pruner, earlier = self.pruning
            if pruner.decide(RunningCandidate(dict(c.means), list(c.scores), tuple(costs or ())), earlier):
                c.status = "pruned"
                self.bar.skip(n - len(c.got))  # never asked: off the total, not counted as done

    def _claim_part(self) -> list[Pair]:
        """Claim a free part of a split candidate of this step (its own first); its pairs."""
        assert self.proposals is not None and self.bar is not None
        n = self.n
        while True:
            state = part_state(self.study, self.step, self.proposals)
            if release_stale(self.study, state):
                continue
            free = state.free(n)
            if not free:
                return []
            own = [f for f in free if any(c.index == f[0] and c.split for c in self.live)]
            i, b = (own or free)[0 if own else self.owner.worker % len(free)]
            won = self.owner._claim(self.step, [(i, self.proposals[i])], part=part_key(b, state.size[i]))
            if not won:
                continue
            lo, hi = b * state.size[i], min(n, (b + 1) * state.size[i])
            template = self.owner.scorer.template(self.proposals[i])
            self.jobs.append(_Part(i, b, lo, hi, self.proposals[i], template, won[0][2]))
            self.bar.add_total(hi - lo)
            return [Pair(key=("part", len(self.jobs) - 1), index=q, template=template, example=self.examples[q])
                    for q in range(lo, hi)]

    def more(self) -> list[Pair]:
        assert self.bar is not None
        if self.proposals is not None:
            part = self._claim_part()
            if part:
                return part
        if self.claim_next is None:
            return []
        got = self.claim_next()
        for idx, instruction, trial in got:
            self.live.append(self._candidate(idx, instruction, trial))
            if self.live[-1].split:
                return self.more()  # its questions come part by part
            self.bar.add_total(self.n)
        return [Pair(key=k, index=i, template=self.live[k].template, example=ex)
                for k in range(len(self.live) - len(got), len(self.live)) for i, ex in enumerate(self.examples)]

    # -- the study's side --------------------------------------------------------------------------
    def _finish_part(self, job: _Part) -> None:
        """Store a part's outcomes on its trial, for the candidate's owner to add up."""
        outcomes = [job.got[i] for i in range(job.lo, job.hi)]
        try:
            self.study.finish_part(job.trial, part_scores=[_PART_ERROR if isinstance(r, LLMError) else r for r in outcomes],
                                   part_usage=[job.usage.get(i) for i in range(job.lo, job.hi)],
                                   failed=any(isinstance(r, LLMError) for r in outcomes))
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            job.lost = True
            logger.warning("worker %d: part %d of candidate %d of step %d was taken over by another worker",
                           self.owner.worker, job.part, job.index, self.step)

    def _report(self, c: _Live, mean: float, b: int, scores: list[float | None] | None,
                costs: list[float | None] | None = None) -> None:
        try:
            self.study.report(c.trial, mean, b, scores, costs)
        except optuna.exceptions.UpdateFinishedTrialError:
            self._lost(c)

    def _lost(self, c: _Live) -> None:
        c.lost = True
        logger.warning(
            "worker %d: candidate %d of step %d was taken over by another worker (this worker's heartbeat was "
            "missed): its result here is dropped", self.owner.worker, c.index, self.step,
        )

    def _collect_parts(self, waiting: Sequence[_Live]) -> None:
        """This worker's split candidates: their other parts come from the other workers (or from
        this one, once a stopped worker's claim is released)."""
        state = part_state(self.study, self.step, self.proposals or ())
        for c in waiting:
            parts = [state.done.get((c.index, b)) for b in range(math.ceil(self.n / c.split))]
            if all(t is not None for t in parts):
                for b, t in enumerate(parts):
                    for q, v in enumerate(t.part_scores):  # type: ignore[union-attr]
                        c.got[b * c.split + q] = _part_outcome(v)
                    for q, u in enumerate(t.part_usage):  # type: ignore[union-attr]
                        if u is not None:
                            c.usage[b * c.split + q] = u
                self._report_ready(c)

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> list[CandidateRecord]:
        total = sum(self.n for c in self.live if not c.split)
        refill = self.claim_next is not None or self.proposals is not None
        engine = self.owner.scorer.engine
        with progress_bar(f"step {self.step}: {len(self.live)} candidate(s)", total=total,
                          enabled=self.owner.progress) as self.bar:
            # Question-major order: consecutive calls share the retrieved context (KV-prefix reuse).
            pairs = [Pair(key=k, index=i, template=c.template, example=ex)
                     for i, ex in enumerate(self.examples) for k, c in enumerate(self.live) if not c.split]
            poll, last_note = 0.05, time.monotonic()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="opro-study") as self.bookkeeper:
                while True:
                    engine.run(pairs, on_scored=self.on_scored, gate=self.gate, more=self.more if refill else None)
                    pairs = []
                    for job in self.reports:
                        job.result()  # this worker's parts are in the study before they are read back
                    self.reports.clear()
                    waiting = [c for c in self.live
                               if c.split and c.status == "complete" and not c.lost and len(c.got) < self.n]
                    if not waiting:
                        break
                    self._collect_parts(waiting)
                    if any(len(c.got) < self.n for c in waiting):
                        if time.monotonic() - last_note > 30:
                            logger.warning("worker %d: step %d waits for parts of %d candidate(s) that other "
                                           "workers are asking", self.owner.worker, self.step, len(waiting))
                            last_note = time.monotonic()
                        time.sleep(poll)
                        poll = min(MAX_POLL_S, poll * 1.5)
            for job in self.reports:
                job.result()
        # Usage first, then the trials: a worker that sees every candidate finished sees its usage too.
        self.owner.usage.save()
        return [r for r in (self._finish(c) for c in self.live if not c.lost) if r is not None]

    def _finish(self, c: _Live) -> CandidateRecord | None:
        n_questions = len(self.examples)
        mean = c.mean()
        n_scored = c.n_valid()
        n_invalid = len(c.scores) - n_scored - c.n_errors
        status: CandidateStatus = c.status
        if mean is None:
            status = "failed" if c.n_errors or not c.scores else "incomplete"
        elif status == "complete" and n_scored < self.owner.settings.min_coverage * n_questions:
            # Coverage rule: a mean over a few valid judgments must not compete with full ones.
            status = "failed" if c.n_errors else "incomplete"
            logger.warning(
                "candidate %r: only %d of %d questions scored validly (%d invalid, %d errors): not complete",
                c.instruction[:60], n_scored, n_questions, n_invalid, c.n_errors,
            )
        scorer = self.owner.scorer
        cost = scorer.cost.summarize(c.usage[i] for i in sorted(c.usage))
        try:
            self.study.finish(c.trial, status=status, score=mean, n_scored=n_scored, n_invalid=n_invalid,
                              n_errors=c.n_errors, scores=c.scores, cost=cost,
                              costs=c.costs(scorer.cost) if self.keeps_costs else None)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            self._lost(c)
            return None
        return CandidateRecord(
            step=self.step, instruction=scorer.instruction_of(c.instruction), score=mean, n_scored=n_scored,
            n_invalid=n_invalid, n_errors=c.n_errors, status=status, trial_number=c.trial.number,
            scores=tuple(c.scores), index=c.index, params=scorer.params_of(c.instruction), cost=cost,
            name=c.instruction,
        )


__all__ = ["StepEvaluator", "pruning"]
