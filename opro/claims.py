"""Work sharing between the workers of one study: every candidate of a step is claimed once.

A worker claims a candidate by creating its Optuna trial (RUNNING, with the step, the proposal
index and the worker's lease token as attributes) in one transaction; the claim that stands for a
proposal index is the lowest-numbered one whose worker is alive. Trial numbers are assigned under a
lock on the study row, so a later claimer always sees the earlier claim and steps back: two workers
never evaluate the same candidate, whatever their timing. A claim whose worker stopped (its lease,
see :class:`opro.locking.StudyLease`, is released, its pid is gone, or its heartbeat is stale) is
failed by whoever sees it, and the candidate is claimed again, so workers may join or leave at any
time and every candidate is still evaluated exactly once.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from opro.locking import lease_alive
from opro.metaprompt import normalize_instruction

#: Statuses a new process evaluates again: the endpoint failed or the budget ran out, not the candidate.
RETRY_STATUSES: frozenset[str] = frozenset({"failed", "budget"})
LEASE_PREFIX = "holder:w"


def live_workers(attrs: Mapping[str, Any], *, stale_s: float = 300.0) -> dict[int, dict[str, Any]]:
    """The live leases of a study (its user attributes), by worker index."""
    out: dict[int, dict[str, Any]] = {}
    for key, held in attrs.items():
        if key.startswith(LEASE_PREFIX) and isinstance(held, dict) and lease_alive(held, stale_s=stale_s):
            out[int(key.removeprefix(LEASE_PREFIX))] = held
    return out


def describe_lease(index: int, held: Mapping[str, Any], *, now: float) -> str:
    """``worker 1 (pid 42 on host-a, last heartbeat 12 s ago)``, or what is known of a stopped one."""
    if held.get("token"):
        beat = held.get("beat")
        ago = f", last heartbeat {now - float(beat):.0f} s ago" if beat else ""
        return f"worker {index} (pid {held.get('pid')} on {held.get('host')}{ago})"
    if held.get("released"):
        return f"worker {index} (finished or stopped; not running now)"
    return f"worker {index} (not started)"


@dataclass
class StepState:
    """Who evaluates what in one step, read from the study."""

    #: Proposal index -> the finished trial that stands for it.
    done: dict[int, optuna.trial.FrozenTrial] = field(default_factory=dict)
    #: Proposal index -> the standing claim of a live worker.
    claimed: dict[int, optuna.trial.FrozenTrial] = field(default_factory=dict)
    #: Running claims whose worker stopped: to be failed, and their candidates claimed again.
    stale: list[optuna.trial.FrozenTrial] = field(default_factory=list)

    def free(self, n: int) -> list[int]:
        return [i for i in range(n) if i not in self.done and i not in self.claimed]


def step_state(
    study: optuna.Study, step: int, proposals: Sequence[str], *, stale_s: float = 300.0, part: str | None = None
) -> StepState:
    """The state of ``step``'s candidates (with ``part``: of that part of each). A candidate is matched
    by its normalized instruction, so trials written before proposal indices were recorded count too.

    A finished candidate whose status says the endpoint failed or the budget ran out stands only
    while the process that evaluated it runs: a new process evaluates it again (resume semantics).
    """
    keys = {normalize_instruction(p): i for i, p in enumerate(proposals)}
    live = _live_tokens(study, stale_s=stale_s)
    state = StepState()
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        a = t.user_attrs
        if a.get("step") != step or "instruction" not in a or a.get("part") != part:
            continue
        i = keys.get(normalize_instruction(a["instruction"]))
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


def _live_tokens(study: optuna.Study, *, stale_s: float) -> set[Any]:
    return {held.get("token") for held in live_workers(study.user_attrs, stale_s=stale_s).values()}


def _standing(t: optuna.trial.FrozenTrial, live: set[Any]) -> str | None:
    """What a claim's trial stands for: ``claimed`` (running, its worker alive), ``stale`` (running,
    its worker stopped), ``done`` (a result), or None (a claim that lost, or was taken over). A result
    whose status says the endpoint failed or the budget ran out stands only while its worker runs."""
    a = t.user_attrs
    if t.state == optuna.trial.TrialState.RUNNING:
        if a.get("claim") in live:
            return "claimed"
        return "stale" if a.get("claim") else None
    status = a.get("status")
    if status is None or t.state == optuna.trial.TrialState.WAITING:
        return None
    if status in RETRY_STATUSES and a.get("claim") not in live:
        return None
    return "done"


def claim(
    study: optuna.Study,
    *,
    step: int,
    items: Sequence[tuple[int, str]],
    token: str,
    worker: int,
    stale_s: float = 300.0,
    part: str | None = None,
) -> list[tuple[int, str, optuna.trial.Trial]]:
    """Claim the candidates ``items`` (proposal index, instruction) of ``step`` (with ``part``: that
    part of each); returns those won."""
    storage = study._storage  # the public ask() cannot create a trial and its attributes in one transaction
    created: list[tuple[int, str, int]] = []
    for index, instruction in items:
        template = optuna.trial.FrozenTrial(
            number=-1,
            state=optuna.trial.TrialState.RUNNING,
            value=None,
            datetime_start=datetime.datetime.now(),
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={
                "instruction": instruction, "step": step, "index": index, "worker": worker,
                "host": socket.gethostname(), "claim": token, **({} if part is None else {"part": part}),
            },
            system_attrs={},
            intermediate_values={},
            trial_id=-1,
        )
        created.append((index, instruction, storage.create_new_trial(study._study_id, template_trial=template)))
    state = step_state(study, step, [ins for _, ins in items], stale_s=stale_s, part=part)
    won: list[tuple[int, str, optuna.trial.Trial]] = []
    for pos, (index, instruction, trial_id) in enumerate(created):
        standing = state.claimed.get(pos)
        if pos not in state.done and standing is not None and standing._trial_id == trial_id:
            won.append((index, instruction, optuna.trial.Trial(study, trial_id)))
        else:
            # Another worker claimed it first: step back. A failed trial without a status is no result.
            number = storage.get_trial(trial_id).number
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    return won


@dataclass
class PartState:
    """The parts of ``step``'s split candidates, read from the study."""

    #: Proposal index -> questions per part, for the candidates split into parts (claimed, running).
    size: dict[int, int] = field(default_factory=dict)
    #: (proposal index, part) -> the finished part trial that stands for it.
    done: dict[tuple[int, int], optuna.trial.FrozenTrial] = field(default_factory=dict)
    claimed: set[tuple[int, int]] = field(default_factory=set)
    stale: list[optuna.trial.FrozenTrial] = field(default_factory=list)

    def parts(self, index: int, n_questions: int) -> int:
        return -(-n_questions // self.size[index])

    def free(self, n_questions: int) -> list[tuple[int, int]]:
        return [(i, b) for i in sorted(self.size) for b in range(self.parts(i, n_questions))
                if (i, b) not in self.done and (i, b) not in self.claimed]


def part_key(part: int, size: int) -> str:
    """A part's ``part`` attribute: its number and its size, so parts cut another way (a rerun with
    another minibatch size) never stand for these."""
    return f"{part}/{size}"


def part_state(study: optuna.Study, step: int, proposals: Sequence[str], *, stale_s: float = 300.0) -> PartState:
    """Which parts of ``step``'s split candidates are done, claimed by a live worker, or stale (the
    same rules as :func:`step_state`)."""
    keys = {normalize_instruction(p): i for i, p in enumerate(proposals)}
    live = _live_tokens(study, stale_s=stale_s)
    state = PartState()
    trials = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        a = t.user_attrs
        i = keys.get(normalize_instruction(a["instruction"])) if a.get("step") == step and "instruction" in a else None
        if i is None:
            continue
        if a.get("part") is None:
            if _standing(t, live) == "claimed" and a.get("parts"):
                state.size[i] = int(a["parts"])
            continue
        trials.append((i, t))
    for i, t in trials:
        standing = _standing(t, live)
        if standing == "stale":
            state.stale.append(t)  # whatever its cut: to be failed
            continue
        number, _, size = str(t.user_attrs["part"]).partition("/")
        if i not in state.size or size != str(state.size[i]):
            continue
        if standing == "claimed":
            state.claimed.add((i, int(number)))
        elif standing == "done":
            state.done.setdefault((i, int(number)), t)
    state.claimed -= set(state.done)
    return state


def release_stale(study: optuna.Study, state: StepState | PartState) -> int:
    """Fail the claims of stopped workers, so their candidates can be claimed again."""
    for t in state.stale:
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    return len(state.stale)


__all__ = [
    "LEASE_PREFIX",
    "RETRY_STATUSES",
    "PartState",
    "StepState",
    "claim",
    "describe_lease",
    "live_workers",
    "part_key",
    "part_state",
    "release_stale",
    "step_state",
]
