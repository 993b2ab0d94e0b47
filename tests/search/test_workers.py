"""Workers of one study: every candidate claimed once, the single-worker history with any number of
workers, stopped workers' candidates taken over, mismatched specs refused, a missing worker named."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import optuna
import pytest
from fakes import history_of as _history_of
from fakes import keyword_examples as _examples
from fakes import keyword_optimizer as _optimizer
from fakes import run_together

from opro.config import OptimizerSection
from opro.errors import ConfigError, LLMBadRequestError, OproError
from opro.search import BestSoFarPruner, EarlierStepsMedianPruner, SearchStudy, WorkerPlan
from opro.search.workers import claim, part_key, step_state
from opro.tracking.recorder import MlflowRecorder

SETTINGS: dict[str, Any] = {
    "steps": 2, "candidates_per_step": 4, "minibatch_size": 2, "pruner": "race", "prune_warmup_minibatches": 1,
}


def _jitter(rig: Any, seed: int) -> None:
    """Replies arrive in a shuffled order: which worker finishes first varies."""
    rng = random.Random(seed)
    for llm in (rig.task, rig.judge, rig.optimizer):
        reply = llm._default

        def respond(messages: Any, options: Any, reply: Any = reply) -> Any:
            time.sleep(rng.random() * 0.004)
            return reply(messages, options)

        llm._default = respond


def _run_workers(tmp_path: Path, n: int, *, seed: int = 0) -> dict[int, Any]:
    """``n`` workers (threads, each with its own models and optimizer) on one SQLite study."""
    results: dict[int, Any] = {}

    def work(index: int) -> None:
        opt, rig, program = _optimizer(tmp_path, **SETTINGS)
        _jitter(rig, seed + index)
        opt.worker_index, opt.num_workers, opt.worker_timeout_s = index, n, 60.0
        results[index] = opt.optimize(program=program, optimization_set=_examples(6),  # type: ignore[arg-type]
                                      exemplar_set=_examples(3), initial_instructions=["Answer the question."])

    errors = run_together(work, threads=n, timeout_s=120)
    assert not errors, errors
    return results


def _results_per_candidate(storage: str, *, parts: bool = False) -> dict[tuple[int, ...], int]:
    """How many finished results each candidate has (with ``parts``: each part of a split candidate)."""
    study = optuna.load_study(study_name="test", storage=storage)
    out: dict[tuple[int, ...], int] = {}
    for t in study.trials:
        a = t.user_attrs
        if a.get("status") is not None and ("part" in a) == parts:
            key = (a["step"], a["index"], *([int(str(a["part"]).split("/")[0])] if parts else []))
            out[key] = out.get(key, 0) + 1
    return out


def test_one_two_and_three_workers_give_the_same_history(tmp_path: Path) -> None:
    """Racing pruner, shuffled reply order: the history (order, scores, pruning decisions) and the
    best are the single worker's with 2 and 3 workers, and each candidate is evaluated exactly once."""
    single = _run_workers(tmp_path / "one", 1)[0]
    assert any(r.status == "pruned" for r in single.history), single.history  # the pruner did decide
    for n in (2, 3):
        results = _run_workers(tmp_path / f"n{n}", n, seed=10 * n)
        for index, result in results.items():
            assert _history_of(result) == _history_of(single), (n, index)
            assert result.best_instruction == single.best_instruction
        counts = _results_per_candidate(f"sqlite:///{tmp_path / f'n{n}' / 'optuna.db'}")
        assert len(counts) == len(single.history) and set(counts.values()) == {1}, counts
        # Step 0 (one candidate, nothing to prune against) was shared question by question: each of
        # its parts (6 questions, parts of 2) has exactly one result.
        parts = _results_per_candidate(f"sqlite:///{tmp_path / f'n{n}' / 'optuna.db'}", parts=True)
        assert sorted(parts) == [(0, 0, b) for b in range(3)] and set(parts.values()) == {1}, parts
        study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path / f'n{n}' / 'optuna.db'}")
        assert study.user_attrs["workers"] == n
        # The summary counts every worker's calls, not worker 0's alone.
        usage = results[0].usage
        per_worker = [study.user_attrs[f"usage:w{i}"] for i in range(n)]
        assert usage["judge"]["calls"] == sum(u.get("judge", {}).get("calls", 0) for u in per_worker)
        assert usage["judge"]["calls"] == results[1].usage["judge"]["calls"]


@pytest.mark.parametrize("helper", ["answers", "fails", "silent"])
def test_waiting_workers_ask_for_their_share_of_the_optimizer_samples(tmp_path: Path, helper: str) -> None:
    """Worker 0 deals a step's optimizer samples to the live workers waiting for its proposals: each
    asks for its share and stores the texts. Samples whose worker's calls fail (it stores the error)
    or who never answers (a live lease that runs no search) are asked for by worker 0. Either way
    the texts are those one worker asking alone gets."""
    alone, _, _ = _optimizer(tmp_path / "alone")
    indices = [1000, 1001, 1002, 1003]
    coordinator, ask = alone.coordinator(token="")
    expected = coordinator.shared_samples(1, "Propose an instruction.", indices, ask)
    w0, rig0, _ = _optimizer(tmp_path)
    w1, rig1, _ = _optimizer(tmp_path)
    study = w0._study()
    coordinators = []
    for index, opt in enumerate((w0, w1)):
        opt.worker_index, opt.num_workers = index, 2
        coordinators.append(opt.coordinator(token=f"token{index}"))
        study.set_user_attr(f"holder:w{index}", {"host": socket.gethostname(), "pid": os.getpid(),
                                                 "token": f"token{index}", "of": 2, "beat": time.time()})
    if helper == "fails":
        def down(messages: Any, options: Any) -> Any:
            raise LLMBadRequestError("the optimizer endpoint refuses this worker")
        rig1.optimizer._default = down
    with ThreadPoolExecutor(1) as pool:
        (c0, ask0), (c1, ask1) = coordinators
        waiting = None if helper == "silent" else pool.submit(c1.await_proposals, 1, ask1)
        started = time.monotonic()
        texts = c0.shared_samples(1, "Propose an instruction.", indices, ask0)
        waited = time.monotonic() - started
        study.set_user_attr("proposals:1", ["done"])
        assert waiting is None or waiting.result(timeout=30) == ["done"]
    assert texts == expected
    stored = {k: v for k, v in study.user_attrs.items() if k.startswith("sample:1:")}
    if helper == "answers":  # two samples each, none asked twice
        assert len(rig0.optimizer.calls) == len(rig1.optimizer.calls) == 2
        assert sorted(v["text"] for v in stored.values()) == sorted(expected[1::2])
        assert study.user_attrs["usage:w1"]["optimizer"]["calls"] == 2  # saved with them: worker 0 counts them
    elif helper == "fails":  # worker 1 stored its errors; worker 0 asked for those samples itself
        assert len(rig0.optimizer.calls) == 4 and len(stored) == 2 and all("error" in v for v in stored.values())
        assert waited < 2.0  # it did not wait out its patience for them
    else:  # nothing stored; worker 0 waited for worker 1 (2 s at least), then asked itself
        assert len(rig0.optimizer.calls) == 4 and not stored and waited >= 2.0


@pytest.mark.parametrize("part", [None, part_key(1, 2)], ids=["candidate", "part"])
def test_a_stopped_workers_claims_are_taken_over(tmp_path: Path, part: str | None) -> None:
    """A worker killed mid-step leaves a running claim behind (on step 0's candidate, or on part 1 of
    it: one candidate split among 2 workers): it is failed and evaluated again, once, by the other
    worker, and the history is the uninterrupted run's."""
    single = _run_workers(tmp_path / "one", 1)[0]
    storage = f"sqlite:///{tmp_path / 'two' / 'optuna.db'}"
    opt, _rig, program = _optimizer(tmp_path / "two", **SETTINGS)
    study = opt._study()
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "token": "gone", "of": 2, "beat": time.time()}
    study.set_user_attr("holder:w1", holder)
    won = claim(SearchStudy(study), step=0, items=[(0, "Answer the question.")], token="gone", worker=1, part=part)
    assert len(won) == 1
    won[0][2].report(1.0, 0)  # it had started, then its process was killed:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    study.set_user_attr("holder:w1", {**holder, "pid": int(dead.stdout)})
    opt.worker_index, opt.num_workers = 0, 2
    result = opt.optimize(program=program, optimization_set=_examples(6), exemplar_set=_examples(3),  # type: ignore[arg-type]
                          initial_instructions=["Answer the question."])
    assert _history_of(result) == _history_of(single)
    assert set(_results_per_candidate(storage).values()) == {1}
    # Step 0 was split (one candidate, two workers): each of its 3 parts has exactly one result.
    parts = _results_per_candidate(storage, parts=True)
    assert sorted(parts) == [(0, 0, b) for b in range(3)] and set(parts.values()) == {1}, parts
    after = optuna.load_study(study_name="test", storage=storage)
    stale = [t for t in after.trials if t.user_attrs.get("claim") == "gone"]
    assert [t.state for t in stale] == [optuna.trial.TrialState.FAIL] and "part_scores" not in stale[0].user_attrs


def test_a_claim_is_won_once(tmp_path: Path) -> None:
    opt, _rig, _program = _optimizer(tmp_path)
    study = opt._study()
    for i, token in enumerate(("a", "b")):
        study.set_user_attr(f"holder:w{i}", {"host": socket.gethostname(), "pid": os.getpid(), "token": token})
    first = claim(SearchStudy(study), step=1, items=[(0, "x"), (1, "y")], token="a", worker=0)
    second = claim(SearchStudy(study), step=1, items=[(0, "x"), (1, "y")], token="b", worker=1)
    assert [i for i, _, _ in first] == [0, 1] and second == []
    state = step_state(SearchStudy(study), 1, ["x", "y"])
    assert sorted(state.claimed) == [0, 1] and not state.free(2)
    study.set_user_attr("holder:w0", {"released": "a"})  # worker 0 stopped: its claims are free again
    state = step_state(SearchStudy(study), 1, ["x", "y"])
    assert len(state.stale) == 2 and state.free(2) == [0, 1]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_the_one_private_optuna_call_creates_a_claim_whole_on_the_installed_optuna(tmp_path: Path, backend: str) -> None:
    """:func:`opro.search.trials.create_trial` (Optuna's private ``Study._storage``/``_study_id``) on
    the Optuna installed: the claim appears at once with its attributes, parameters and RUNNING
    state, its number is the study's, and the public ``Trial`` opens it by its id."""
    from opro.search.trials import CandidateTrial, claim_template, create_trial

    storage = None if backend == "memory" else f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=1.0))  # numbers start after the trials already there
    dist = optuna.distributions.IntDistribution(1, 8)
    template = claim_template(instruction="x", step=1, index=2, worker=0, token="t", part=None,
                              params={"top_k": 3}, distributions={"top_k": dist})
    created = create_trial(study, template)
    assert created.number == 1
    stored = CandidateTrial.of(study.get_trials(deepcopy=False)[-1])
    assert (stored.number, stored.state, stored.instruction, stored.step, stored.index, stored.claim) == (
        1, optuna.trial.TrialState.RUNNING, "x", 1, 2, "t")
    assert dict(stored.params) == {"top_k": 3}
    trial = SearchStudy(study).running(created)
    assert trial.number == created.number and trial.params == {"top_k": 3}
    trial.report(0.5, 0)
    study.tell(trial, 0.5)
    assert study.get_trials(deepcopy=False)[-1].value == 0.5


def test_mismatched_worker_specs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OproError, match=r"--worker 0/0: N is the number of workers .* must be >= 1"):
        WorkerPlan(index=0, count=0)
    with pytest.raises(OproError, match=r"--worker 2/2: the index I must be within 0\.\.1"):
        WorkerPlan(index=2, count=2)
    opt, _rig, program = _optimizer(tmp_path, steps=1)
    study = opt._study()
    # Worker 0 of 2 is running (this process, so its lease is alive): a worker 1 of 3 is refused.
    study.set_user_attr("holder:w0", {"host": socket.gethostname(), "pid": os.getpid(), "token": "t", "of": 2})
    opt.worker_index, opt.num_workers = 1, 3
    with pytest.raises(ConfigError, match=r"being worked on by --worker 0/2 .* started as --worker 1/3: every worker"):
        opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Answer."])  # type: ignore[arg-type]
    assert not study.trials  # refused before evaluating anything


def test_a_missing_worker_0_is_named_and_the_run_ends_failed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Tracker:
        run_id: str | None = None
        statuses: ClassVar[list[str]] = []

        def finish(self, *, status: str = "FINISHED") -> None:
            self.statuses.append(f"{self.run_id}:{status}")

    opt, _rig, program = _optimizer(tmp_path, steps=1)
    study = opt._study()
    study.set_user_attr("mlflow_run_id", "run-1")
    opt.worker_index, opt.num_workers, opt.worker_timeout_s = 1, 2, 1.0
    tracker = Tracker()
    opt.recorders = (MlflowRecorder(tracker),)  # type: ignore[arg-type]
    with caplog.at_level("WARNING"), pytest.raises(OproError, match=r"worker 1: waited 1 s for the proposals of step 1, "
                                                   r"but worker 0 \(not started\) is not running: start it"):
        # Worker 1 evaluates step 0 (the initial instructions) alone, then needs worker 0's proposals.
        opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Answer."])  # type: ignore[arg-type]
    assert tracker.statuses == ["run-1:FAILED"]


def _trial(step: int, value: float, intermediate: dict[int, float], state: Any = None) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        value=value if state is None else None, state=optuna.trial.TrialState.COMPLETE if state is None else state,
        user_attrs={"step": step, "index": 0}, intermediate_values=intermediate,
    )


@pytest.mark.parametrize("pruner", [BestSoFarPruner(margin=0.5, warmup=1), EarlierStepsMedianPruner(warmup=1)])
def test_pruners_compare_only_with_earlier_steps(pruner: optuna.pruners.BasePruner) -> None:
    """A same-step candidate that happened to finish first (on another worker) never decides."""
    study = optuna.create_study(direction="maximize")
    study.add_trial(_trial(2, 5.0, {0: 5.0}))  # same step, finished first
    current = _trial(2, 0.0, {0: 2.0}, state=optuna.trial.TrialState.RUNNING)
    assert pruner.prune(study, current) is False
    study.add_trial(_trial(1, 4.0, {0: 4.0}))  # an earlier step
    assert pruner.prune(study, current) is True


def test_worker_wait_is_a_checked_setting() -> None:
    from opro.config import TrackingSection

    assert TrackingSection().worker_wait_s == 600.0
    with pytest.raises(ConfigError, match=r"\[tracking\]\.worker_wait_s must be within 1\.\.86400, got 0"):
        TrackingSection(worker_wait_s=0)
    assert OptimizerSection().pruner == "race"
