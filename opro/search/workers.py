"""Work sharing between the workers of one study: every candidate of a step is claimed once.

A worker claims a candidate by creating its Optuna trial (RUNNING, with the step, the proposal
index and the worker's lease token as attributes) in one transaction; the claim that stands for a
proposal index is the lowest-numbered one whose worker is alive. Trial numbers are assigned under a
lock on the study row, so a later claimer always sees the earlier claim and steps back: two workers
never evaluate the same candidate, whatever their timing. A claim whose worker stopped (its lease,
see :class:`opro.locking.StudyLease`, is released, its pid is gone, or its heartbeat is stale) is
failed by whoever sees it, and the candidate is claimed again, so workers may join or leave at any
time and every candidate is still evaluated exactly once.

Worker 0 proposes; the others help it sample (:meth:`Coordinator.shared_samples`) and then read its
proposals from the study (:meth:`Coordinator.await_proposals`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna

from opro.errors import ConfigError, LLMError, OproError
from opro.llm.client import UsageByRole, UsageLedger
from opro.locking import lease_alive
from opro.search.metaprompt import normalize_instruction
from opro.search.results import merge_usage
from opro.search.study import RETRY_STATUSES, SearchStudy, StudyView, sha
from opro.search.trials import CandidateTrial, NewTrial

if TYPE_CHECKING:
    from opro.search.scoring import CandidateScorer

logger = logging.getLogger(__name__)

#: How often, at most, a worker waiting on the study looks again (proposals, other workers' candidates):
#: each second of polling is a second both workers may sit idle at every step's end.
MAX_POLL_S = 0.2


class WorkerSpecError(ConfigError):
    """A ``--worker I/N`` that names no worker."""


@dataclass(frozen=True)
class WorkerPlan:
    """Which worker this process is (``index`` of ``count`` sharing one study) and how long it waits
    for a missing worker 0."""

    index: int = 0
    count: int = 1
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        check_worker_spec(self.index, self.count)

    @classmethod
    def solo(cls) -> WorkerPlan:
        return cls()

    @property
    def lead(self) -> bool:
        """Worker 0 proposes, validates and records."""
        return self.index == 0


def check_worker_spec(worker_index: int, num_workers: int) -> None:
    """Refuse a ``--worker I/N`` that names no worker (``0/0``, ``2/2``), saying what to write instead."""
    if num_workers < 1:
        raise WorkerSpecError(
            f"--worker {worker_index}/{num_workers}: N is the number of workers sharing the study and must be "
            ">= 1 (for one process leave --worker out, for two start --worker 0/2 and --worker 1/2)"
        )
    if not 0 <= worker_index < num_workers:
        raise WorkerSpecError(
            f"--worker {worker_index}/{num_workers}: the index I must be within 0..{num_workers - 1} "
            f"(workers are numbered from 0: --worker 0/{num_workers} to --worker {num_workers - 1}/{num_workers})"
        )


def describe_lease(index: int, held: Mapping[str, Any], *, now: float) -> str:
    """``worker 1 (pid 42 on host-a, last heartbeat 12 s ago)``, or what is known of a stopped one."""
    if held.get("token"):
        beat = held.get("beat")
        ago = f", last heartbeat {now - float(beat):.0f} s ago" if beat else ""
        return f"worker {index} (pid {held.get('pid')} on {held.get('host')}{ago})"
    if held.get("released"):
        return f"worker {index} (finished or stopped; not running now)"
    return f"worker {index} (not started)"


# -- claims ------------------------------------------------------------------------------------------
@dataclass
class StepState:
    """Who evaluates what in one step, read from the study."""

    #: Proposal index -> the finished trial that stands for it.
    done: dict[int, CandidateTrial] = field(default_factory=dict)
    #: Proposal index -> the standing claim of a live worker.
    claimed: dict[int, CandidateTrial] = field(default_factory=dict)
    #: Running claims whose worker stopped: to be failed, and their candidates claimed again.
    stale: list[CandidateTrial] = field(default_factory=list)

    def free(self, n: int) -> list[int]:
        return [i for i in range(n) if i not in self.done and i not in self.claimed]


def step_state(
    study: SearchStudy, step: int, proposals: Sequence[str], *, stale_s: float = 300.0, part: str | None = None
) -> StepState:
    """The state of ``step``'s candidates, given by name (with ``part``: of that part of each). A
    candidate is matched by its name (:attr:`CandidateTrial.name`, normalized), so trials written
    before proposal indices were recorded count too.

    A finished candidate whose status says the endpoint failed or the budget ran out stands only
    while the process that evaluated it runs: a new process evaluates it again (resume semantics).
    """
    keys = {normalize_instruction(p): i for i, p in enumerate(proposals)}
    live = _live_tokens(study, stale_s=stale_s)
    state = StepState()
    for t in sorted(study.trials(), key=lambda t: t.number):
        if t.step != step or t.name is None or t.part != part:
            continue
        i = keys.get(normalize_instruction(t.name))
        if i is None:
            continue
        standing = _standing(t, live)
        if standing == "claimed":
            state.claimed.setdefault(i, t)
        elif standing == "stale":
            state.stale.append(t)
        elif standing == "done":
            state.done[i] = t
    for i in state.done:
        state.claimed.pop(i, None)
    return state


def _live_tokens(study: SearchStudy, *, stale_s: float) -> set[Any]:
    return {held.get("token") for held in study.view().live_workers(stale_s=stale_s).values()}


def _standing(t: CandidateTrial, live: set[Any]) -> str | None:
    """What a claim's trial stands for: ``claimed`` (running, its worker alive), ``stale`` (running,
    its worker stopped), ``done`` (a result), or None (a claim that lost, or was taken over). A result
    whose status says the endpoint failed or the budget ran out stands only while its worker runs."""
    if t.state == optuna.trial.TrialState.RUNNING:
        if t.claim in live:
            return "claimed"
        return "stale" if t.claim else None
    if t.status is None or t.state == optuna.trial.TrialState.WAITING:
        return None
    if t.status in RETRY_STATUSES and t.claim not in live:
        return None
    return "done"


def claim(
    study: SearchStudy,
    *,
    step: int,
    items: Sequence[tuple[int, str]],
    token: str,
    worker: int,
    stale_s: float = 300.0,
    part: str | None = None,
    scorer: CandidateScorer | None = None,
) -> list[tuple[int, str, optuna.trial.Trial]]:
    """Claim the candidates ``items`` (proposal index, candidate name) of ``step`` (with ``part``: that
    part of each); returns those won. Each claim's trial carries the candidate's instruction and name
    and, with a search space, its values as trial parameters: as ``scorer`` was told them
    (:meth:`CandidateScorer.configure`; without one, a name is an instruction)."""
    space = scorer.space if scorer is not None else None
    dists = space.distributions() if space is not None else None

    def claim_one(index: int, name: str) -> NewTrial:
        instruction = scorer.instruction_of(name) if scorer is not None else name
        params = scorer.params_of(name) if scorer is not None and space is not None and part is None else None
        return study.new_claim(instruction=instruction, step=step, index=index, worker=worker, token=token,
                               part=part, params=params, distributions=dists, name=name)

    created = [(index, name, claim_one(index, name)) for index, name in items]
    state = step_state(study, step, [ins for _, ins in items], stale_s=stale_s, part=part)
    won: list[tuple[int, str, optuna.trial.Trial]] = []
    for pos, (index, instruction, new) in enumerate(created):
        standing = state.claimed.get(pos)
        if pos not in state.done and standing is not None and standing.number == new.number:
            won.append((index, instruction, study.running(new)))
        else:
            # Another worker claimed it first: step back. A failed trial without a status is no result.
            study.fail(new.number)
    return won


@dataclass
class PartState:
    """The parts of ``step``'s split candidates, read from the study."""

    #: Proposal index -> questions per part, for the candidates split into parts (claimed, running).
    size: dict[int, int] = field(default_factory=dict)
    #: (proposal index, part) -> the finished part trial that stands for it.
    done: dict[tuple[int, int], CandidateTrial] = field(default_factory=dict)
    claimed: set[tuple[int, int]] = field(default_factory=set)
    stale: list[CandidateTrial] = field(default_factory=list)

    def parts(self, index: int, n_questions: int) -> int:
        return -(-n_questions // self.size[index])

    def free(self, n_questions: int) -> list[tuple[int, int]]:
        return [(i, b) for i in sorted(self.size) for b in range(self.parts(i, n_questions))
                if (i, b) not in self.done and (i, b) not in self.claimed]


def part_key(part: int, size: int) -> str:
    """A part's ``part`` attribute: its number and its size, so parts cut another way (a rerun with
    another minibatch size) never stand for these."""
    return f"{part}/{size}"


def part_state(study: SearchStudy, step: int, proposals: Sequence[str], *, stale_s: float = 300.0) -> PartState:
    """Which parts of ``step``'s split candidates are done, claimed by a live worker, or stale (the
    same rules as :func:`step_state`)."""
    keys = {normalize_instruction(p): i for i, p in enumerate(proposals)}
    live = _live_tokens(study, stale_s=stale_s)
    state = PartState()
    trials = []
    for t in sorted(study.trials(), key=lambda t: t.number):
        i = keys.get(normalize_instruction(t.name)) if t.step == step and t.name is not None else None
        if i is None:
            continue
        if t.part is None:
            if _standing(t, live) == "claimed" and t.parts:
                state.size[i] = t.parts
            continue
        trials.append((i, t))
    for i, t in trials:
        standing = _standing(t, live)
        if standing == "stale":
            state.stale.append(t)  # whatever its cut: to be failed
            continue
        number, _, size = str(t.part).partition("/")
        if i not in state.size or size != str(state.size[i]):
            continue
        if standing == "claimed":
            state.claimed.add((i, int(number)))
        elif standing == "done":
            state.done.setdefault((i, int(number)), t)
    state.claimed -= set(state.done)
    return state


def release_stale(study: SearchStudy, state: StepState | PartState) -> int:
    """Fail the claims of stopped workers, so their candidates can be claimed again."""
    for t in state.stale:
        study.fail(t.number)
    return len(state.stale)


# -- usage across workers ----------------------------------------------------------------------------
class UsageBook:
    """This worker's LLM usage beside what earlier processes and the other workers recorded in the
    study: budgets and totals cover the whole study."""

    def __init__(self, study: SearchStudy, ledger: UsageLedger, *, worker: int) -> None:
        self.study = study
        self.ledger = ledger
        self.worker = worker
        self._prior: UsageByRole = {}
        self._others: UsageByRole = {}

    def total(self) -> UsageByRole:
        """Usage of every process and worker that worked on this study, this one included."""
        return merge_usage(self._others, merge_usage(self._prior, self.ledger.as_dict()))

    def save(self) -> None:
        self.study.save_usage(self.worker, merge_usage(self._prior, self.ledger.as_dict()))

    def load(self) -> None:
        self._prior = self.study.usage(self.worker)
        self.load_others()

    def load_others(self) -> None:
        """The other workers' usage as they last saved it (before telling their candidates' trials)."""
        others: UsageByRole = {}
        for value in self.study.view().usage_of_others(self.worker):
            others = merge_usage(others, value)
        self._others = others


# -- worker 0 and the others -------------------------------------------------------------------------
#: Asks the optimizer LLM for the samples of these indices of one prompt; their texts in order.
Ask = Callable[[str, Sequence[int]], list[str]]


class Coordinator:
    """How this worker works with the others of its study: its lease token, the samples worker 0
    deals out, the proposals the others wait for, and worker 0's decision to stop."""

    def __init__(self, study: SearchStudy, plan: WorkerPlan, usage: UsageBook) -> None:
        self.study = study
        self.plan = plan
        self.usage = usage
        #: This process's lease token: its claims on candidates carry it.
        self.token = ""
        #: This worker gave up waiting for a worker 0 that is gone.
        self.abandoned = False

    def live_workers(self) -> dict[int, dict[str, Any]]:
        return self.study.view().live_workers()

    def check_workers(self) -> None:
        """Refuse to work beside live workers started with another N (each must say the same
        ``--worker I/N``); record N in the study. Checked after taking the lease, so of two processes
        starting together at least one sees the other."""
        p = self.plan
        others = {i: h for i, h in self.live_workers().items() if i != p.index}
        wrong = {i: h for i, h in others.items() if h.get("of") != p.count}
        if wrong:
            shown = ", ".join(
                f"--worker {i}/{h.get('of', '?')} (pid {h.get('pid')} on {h.get('host')})" for i, h in sorted(wrong.items())
            )
            raise WorkerSpecError(
                f"study {self.study.name!r} is being worked on by {shown}, but this process was started as "
                f"--worker {p.index}/{p.count}: every worker of a study must be started with the "
                "same N. Stop this one and start it with the N the others use (or stop the others first)"
            )
        self.study.set_workers(p.count)

    def stop(self, step: int, reason: str) -> str:
        """Worker 0 records that the search stops before ``step``, for the workers waiting for its proposals."""
        self.study.stop(step, reason=reason, token=self.token)
        return reason

    def stopped_reason(self, step: int) -> str:
        return str(self.study.view().stopped(step).get("reason") or "budget")

    def shared_samples(self, step: int, prompt: str, indices: Sequence[int], ask: Ask) -> list[str]:
        """The texts of a step's first samples. Live workers waiting for the step's proposals ask for
        some of them (the samples dealt to the live workers in turn, by index) and store the texts in
        the study, so that N workers take 1/N of the rounds of the optimizer's concurrency; this worker
        asks for its own and for any that a helper failed, left, or is late with."""
        live = self.live_workers()
        me = self.plan.index
        helpers = sorted(w for w in live if w != me)
        if not helpers or len(indices) < 2:
            return ask(prompt, indices)
        order = [me, *helpers]
        dealt = {i: order[n % len(order)] for n, i in enumerate(indices)}
        tag = sha(prompt)
        self.study.deal_samples(step, tag=tag, prompt=prompt, dealt={
            i: {"worker": w, "token": live[w].get("token")} for i, w in dealt.items() if w in live
        })
        started = time.monotonic()
        mine = [i for i in indices if dealt[i] == me]
        texts = dict(zip(mine, ask(prompt, mine), strict=True))
        # A helper gets as long again as this worker's own share took (at least 2 s) before its
        # samples are asked for here too.
        patience = max(2.0, 2 * (time.monotonic() - started))
        poll = 0.02
        while True:
            view = self.study.view()
            alive = view.live_workers()
            late = time.monotonic() - started > patience
            again: list[int] = []
            for i in indices:
                if i in texts:
                    continue
                got = view.sample(step, tag, i)
                held = alive.get(dealt[i]) or {}
                if "text" in got:
                    texts[i] = str(got["text"])
                elif "error" in got or late or held.get("token") != live[dealt[i]].get("token"):
                    again.append(i)
            if again:
                texts.update(zip(again, ask(prompt, again), strict=True))
            if len(texts) == len(indices):
                return [texts[i] for i in indices]
            time.sleep(poll)
            poll = min(MAX_POLL_S, poll * 1.5)

    def _help_sample(self, step: int, view: StudyView, ask: Ask) -> None:
        """Ask for the samples worker 0 dealt to this worker (see :meth:`shared_samples`) and store
        their texts in the study (or that the call failed, for worker 0 to ask again)."""
        sampling = view.sampling(step) or {}
        tag, prompt = str(sampling.get("tag")), str(sampling.get("prompt"))
        mine = sorted(
            int(i) for i, d in (sampling.get("dealt") or {}).items()
            if d.get("worker") == self.plan.index and d.get("token") == self.token
            and not view.has_sample(step, tag, int(i))
        )
        if not mine or sha(prompt) != tag:
            return
        try:
            got: list[dict[str, str]] = [{"text": text} for text in ask(prompt, mine)]
        except LLMError as exc:
            logger.warning("worker %d: the optimizer samples of step %d failed here (%s); worker 0 asks again",
                           self.plan.index, step, exc)
            got = [{"error": str(exc)[:200]} for _ in mine]
        self.usage.save()  # first, so that worker 0, seeing the samples, counts their calls
        for i, value in zip(mine, got, strict=True):
            self.study.save_sample(step, tag, i, value)

    def await_proposals(self, step: int, ask: Ask) -> list[str] | None:
        """Worker 0's proposals for ``step`` (worker 0 proposes; the others ask for the samples it deals
        them, then read the proposals from the study), or None when worker 0 stopped the search before
        ``step``. Waits as long as worker 0 runs, and ``timeout_s`` for a worker 0 that does not."""
        missing_since: float | None = None
        last_note = time.monotonic()
        poll = 0.05
        helped: object = None  # the dealing this worker helped with
        while True:
            view = self.study.view()
            proposals = view.proposals(step)
            if proposals is not None:
                return proposals
            sampling = view.sampling(step)
            if sampling is not None and sampling != helped:
                self._help_sample(step, view, ask)
                helped, poll = sampling, 0.05
                continue
            held = view.lease(0)
            stop = view.stopped(step)
            if stop.get("token") and stop["token"] in (held.get("token"), held.get("released")):
                logger.info("worker %d: worker 0 stopped the search before step %d (%s)", self.plan.index, step,
                            stop.get("reason"))
                return None
            now = time.monotonic()
            if lease_alive(held):
                missing_since = None
            elif missing_since is None:
                missing_since = now
            elif now - missing_since > self.plan.timeout_s:
                self.abandoned = True
                raise OproError(
                    f"worker {self.plan.index}: waited {self.plan.timeout_s:.0f} s for the proposals of step {step}, "
                    f"but {describe_lease(0, held, now=time.time())} is not running: start it (`opro optimize CONFIG "
                    f"--worker 0/{self.plan.count}` resumes the study) and rerun this worker; finished work is kept. "
                    "[tracking].worker_wait_s sets how long a worker waits for a missing one"
                )
            if now - last_note > 30:
                logger.warning("worker %d: waiting for the proposals of step %d from %s", self.plan.index, step,
                               describe_lease(0, held, now=time.time()))
                last_note = now
            time.sleep(poll)
            poll = min(MAX_POLL_S, poll * 1.5)


def shared_sqlite_warning(storage: str, *, num_workers: int) -> str | None:
    """What to tell workers that share a study through a SQLite file (None: nothing to tell)."""
    if num_workers <= 1 or not storage.startswith("sqlite"):
        return None
    return (f"{num_workers} workers share the study through a SQLite file: that works only for processes on "
            "this machine and serializes every write; for workers on several machines use PostgreSQL "
            "([tracking].optuna_storage = \"postgresql+psycopg2://...\", see docs/scaling.md)")


__all__ = [
    "Coordinator",
    "PartState",
    "StepState",
    "UsageBook",
    "WorkerPlan",
    "WorkerSpecError",
    "check_worker_spec",
    "claim",
    "describe_lease",
    "part_key",
    "part_state",
    "release_stale",
    "shared_sqlite_warning",
    "step_state",
]
