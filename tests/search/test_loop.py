"""The OPRO loop on scripted models: best is best, stopping rules, pruning, resume after a kill."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from children import argv
from fakes import Rig, run_together
from fakes import history_of as _history_of
from fakes import keyword_examples as _examples
from fakes import keyword_optimizer as _optimizer

from opro.experiment.settings import pruner_settings
from opro.llm.cache import CallCache
from opro.search import make_pruner


def test_loop_finds_the_best_and_keeps_complete_history(tmp_path: Path) -> None:
    opt, _rig, program = _optimizer(tmp_path)
    result = opt.optimize(
        program=program,  # type: ignore[arg-type]
        optimization_set=_examples(4),
        exemplar_set=_examples(3),
        initial_instructions=["Answer the question."],
    )
    complete = [r for r in result.history if r.status == "complete"]
    assert result.best_score == max(r.score for r in complete if r.score is not None)
    assert result.initial_score == 1.0  # no keyword: 1 on every question
    assert result.best_score > result.initial_score
    assert len(result.history) == 1 + 3 * 3
    assert {r.step for r in result.history} == {0, 1, 2, 3}
    assert all(r.n_scored == 4 for r in result.history)
    assert result.best_template.startswith(result.best_instruction)
    out = tmp_path / "out"
    lines = (out / "history.jsonl").read_text().splitlines()
    assert len(lines) == len(result.history)
    summary = result.summary()  # summary.json is the composition root's (tests/test_experiment.py)
    assert summary["best_score"] == result.best_score
    assert (out / "best_prompt.txt").read_text() == result.best_template
    assert (out / "score_trajectory.png").stat().st_size > 1000
    assert (out / "metaprompts" / "step_001.txt").exists()
    # meta-prompt of a later step shows earlier scored instructions
    assert "Answer the question." in (out / "metaprompts" / "step_002.txt").read_text()
    study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(study.trials) == len(result.history)
    assert study.best_value == result.best_score


def test_patience_stops_without_improvement(tmp_path: Path) -> None:
    opt, _rig, program = _optimizer(tmp_path, steps=10, patience=1)
    result = opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Use the context, be precise, cite, be brief."])  # type: ignore[arg-type]
    # The initial instruction already scores 5: the first step cannot beat it, patience 1 stops.
    assert result.stopped_reason == "patience"
    assert max(r.step for r in result.history) == 1


def test_an_optimizer_that_only_repeats_itself_stops_the_search_after_three_empty_steps(tmp_path: Path) -> None:
    opt, rig, program = _optimizer(tmp_path, steps=1000, candidates_per_step=2)
    rig.optimizer._default = "<INS>Be precise.</INS>"  # the same sample, always
    result = opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Answer."])  # type: ignore[arg-type]
    assert result.stopped_reason == "no new candidates"
    # Step 1 accepts the instruction once; steps 2, 3 and 4 propose nothing new; nothing after.
    assert [r.instruction for r in result.history] == ["Answer.", "Be precise."]
    assert len(rig.optimizer.calls) == 4 * 6  # per step 2 samples, then top-ups until 3 x 2 were asked


def test_budget_stops_the_loop(tmp_path: Path) -> None:
    opt, rig, program = _optimizer(tmp_path, steps=10, max_calls=30)
    result = opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Answer."])  # type: ignore[arg-type]
    assert result.stopped_reason == "budget"
    # A cap: a step or a minibatch that would not fit is not started.
    assert 30 - 3 * 2 * 2 < rig.usage.total_calls() <= 30


def test_pruning_prunes_and_saves_calls(tmp_path: Path) -> None:
    kwargs = {"steps": 2, "candidates_per_step": 4, "minibatch_size": 1}
    pruned_opt, pruned_rig, program = _optimizer(tmp_path / "a", pruner="best", prune_margin=1.0, **kwargs)
    pruned = pruned_opt.optimize(program=program, optimization_set=_examples(6), initial_instructions=["Use the context. Be precise. Cite."])  # type: ignore[arg-type]
    full_opt, full_rig, program2 = _optimizer(tmp_path / "b", pruner="none", **kwargs)
    full = full_opt.optimize(program=program2, optimization_set=_examples(6), initial_instructions=["Use the context. Be precise. Cite."])  # type: ignore[arg-type]
    n_pruned = sum(1 for r in pruned.history if r.status == "pruned")
    assert n_pruned >= 1
    assert all(r.n_scored < 6 for r in pruned.history if r.status == "pruned")
    assert len(pruned_rig.judge.calls) < len(full_rig.judge.calls)
    assert pruned.best_score == full.best_score
    study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path / 'a' / 'optuna.db'}")
    assert sum(1 for t in study.trials if t.state == optuna.trial.TrialState.PRUNED) == n_pruned


def test_pruning_decisions_do_not_wait_for_the_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pruner decides in-process from the candidate and the earlier steps; the study's copy of
    each running mean is written on the bookkeeping thread, so requests never wait on storage."""
    writers: list[str] = []
    write = optuna.storages.RDBStorage.set_trial_intermediate_value

    def recorded(self: optuna.storages.RDBStorage, *args: object, **kwargs: object) -> None:
        writers.append(threading.current_thread().name)
        write(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_intermediate_value", recorded)
    opt, _rig, program = _optimizer(tmp_path, pruner="best", prune_margin=1.0, steps=2, candidates_per_step=4,
                                    minibatch_size=1)
    result = opt.optimize(program=program, optimization_set=_examples(6), initial_instructions=["Use the context. Be precise. Cite."])  # type: ignore[arg-type]
    assert any(r.status == "pruned" for r in result.history)
    assert writers and all(name.startswith("opro-study") for name in writers), sorted(set(writers))
    # The study holds what the decisions read: Optuna's own prune() agrees with the in-process one.
    study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    pruner = make_pruner(pruner_settings(opt.settings))
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and all(pruner.prune(study, t) for t in pruned)


def test_warm_cache_rerun_makes_no_calls(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "calls.sqlite")
    opt, _rig, program = _optimizer(tmp_path / "one", cache=cache, steps=1)
    first = opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Answer."])  # type: ignore[arg-type]
    opt2, rig2, program2 = _optimizer(tmp_path / "two", cache=cache, steps=1)  # fresh study, warm cache
    second = opt2.optimize(program=program2, optimization_set=_examples(2), initial_instructions=["Answer."])  # type: ignore[arg-type]
    assert rig2.usage.total_calls() == 0
    assert not rig2.task.calls and not rig2.judge.calls and not rig2.optimizer.calls
    assert [r.instruction for r in second.history] == [r.instruction for r in first.history]
    assert second.best_score == first.best_score


def _run_child(folder: Path, slow: float, **kwargs: object) -> subprocess.Popen[str]:
    """:func:`children.keyword_search` in ``folder``, each judge call ``slow`` seconds slower."""
    return subprocess.Popen(argv("keyword_search", folder, slow), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)  # type: ignore[call-overload]


def _calls(out: str) -> tuple[int, int, int]:
    m = re.search(r"CALLS (\d+) (\d+) (\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def test_resume_after_kill_loses_nothing_and_repeats_no_call(tmp_path: Path) -> None:
    # Reference: one uninterrupted run.
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref = _run_child(ref_dir, 0.0)
    ref_out, ref_err = ref.communicate(timeout=300)
    assert ref.returncode == 0, ref_err
    ref_calls = _calls(ref_out)
    ref_best = re.search(r"BEST (\S+) (\d+)", ref_out)
    assert ref_best

    # Interrupted run: SIGKILL once a few candidates are finished, then resume.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = _run_child(run_dir, 0.05, start_new_session=True)
    storage = f"sqlite:///{run_dir / 'optuna.db'}"
    deadline = time.monotonic() + 120
    finished = 0
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.3)
        try:
            study = optuna.load_study(study_name="test", storage=storage)
        except Exception:
            continue
        finished = sum(1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
        if finished >= 3:
            os.killpg(child.pid, signal.SIGKILL)
            break
    child.wait(timeout=30)
    assert finished >= 3, "the child finished before it could be interrupted"
    assert child.returncode == -signal.SIGKILL
    before = optuna.load_study(study_name="test", storage=storage)
    done_before = {t.user_attrs["instruction"]: t.value for t in before.trials if t.state == optuna.trial.TrialState.COMPLETE}

    # Count backend calls made by the killed run from the cache contents, then resume.
    killed_calls = len(CallCache(run_dir / "calls.sqlite"))
    resumed = _run_child(run_dir, 0.0)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    resumed_calls = sum(_calls(out))
    best = re.search(r"BEST (\S+) (\d+)", out)
    assert best
    # Nothing lost: same number of candidates and the same best as the uninterrupted run.
    assert best.group(1) == ref_best.group(1) and best.group(2) == ref_best.group(2)
    # No call repeated: the killed run's calls plus the resumed run's calls are exactly the reference's.
    assert killed_calls + resumed_calls == sum(ref_calls)
    after = optuna.load_study(study_name="test", storage=storage)
    for t in after.trials:
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["instruction"] in done_before:
            assert t.number < len(before.trials)  # finished candidates were not evaluated again


def test_two_workers_share_one_study(tmp_path: Path) -> None:
    """Worker 0 proposes; both workers evaluate their share of each step through the shared storage."""
    results: dict[int, object] = {}
    rigs: dict[int, Rig] = {}

    def work(index: int) -> None:
        opt, rig, program = _optimizer(tmp_path, steps=2, candidates_per_step=4)
        opt.worker_index, opt.num_workers, opt.worker_timeout_s = index, 2, 60.0
        rigs[index] = rig
        results[index] = opt.optimize(program=program, optimization_set=_examples(2), initial_instructions=["Answer.", "Reply."])  # type: ignore[arg-type]

    # Both open the fresh store at the same instant (run_together's barrier): the schema race.
    errors = run_together(work, threads=2, timeout_s=120)
    assert not errors, errors
    r0, r1 = results[0], results[1]
    assert len(r0.history) == len(r1.history) == 2 + 2 * 4  # type: ignore[attr-defined]
    assert r0.best_score == r1.best_score  # type: ignore[attr-defined]
    # Worker 0 proposes (the samples it deals to a waiting worker are asked for there: none twice).
    # Which worker claims which candidate depends on when each thread reaches the study (claims are
    # shared among the live workers), so only the result is asserted: the same history for both and
    # every candidate evaluated exactly once. tests/search/test_scaleout.py checks that a second worker
    # process claims work.
    seeds = [options.seed for rig in rigs.values() for _, options in rig.optimizer.calls]
    assert rigs[0].optimizer.calls and len(seeds) == len(set(seeds)), seeds
    assert rigs[0].judge.calls or rigs[1].judge.calls
    study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    evaluated = [t for t in study.trials if t.user_attrs.get("status") is not None]
    assert len(evaluated) == 10  # nothing evaluated twice
    assert len({(t.user_attrs["step"], t.user_attrs["index"]) for t in evaluated}) == 10


def test_one_and_32_workers_give_the_same_history_and_the_same_calls(tmp_path: Path) -> None:
    """The streaming engine's results do not depend on which worker finished first: with pruning
    (racing) and with a call budget, 1 and 32 workers give the same history and ask the same calls."""
    import random

    def jittered(reply):  # type: ignore[no-untyped-def]
        rng = random.Random(0)

        def respond(messages, options):  # type: ignore[no-untyped-def]
            time.sleep(rng.random() * 0.003)  # shuffles completion order under concurrency
            return reply(messages, options)

        return respond

    outcomes = []
    for workers, settings in [(w, s) for s in ({"pruner": "race"}, {"max_calls": 150}) for w in (1, 32)]:
        run_dir = tmp_path / f"{workers}-{len(outcomes)}"
        opt, rig, program = _optimizer(
            run_dir, steps=3, candidates_per_step=4, minibatch_size=2, prune_warmup_minibatches=1, **settings
        )
        for llm in (rig.task, rig.judge, rig.optimizer):
            llm.max_concurrency = workers
            llm._default = jittered(llm._default)
        opt.task_workers, opt.judge_workers = workers, workers
        result = opt.optimize(program=program, optimization_set=_examples(8),  # type: ignore[arg-type]
                              exemplar_set=_examples(3), initial_instructions=["Answer the question."])
        calls = sorted(m[-1].content for m, _ in rig.task.calls + rig.judge.calls + rig.optimizer.calls)
        outcomes.append((workers, settings, _history_of(result), calls, result.stopped_reason))
    (_, _, h1, c1, s1), (_, _, h32, c32, s32), (_, _, b1, d1, t1), (_, _, b32, d32, t32) = outcomes
    assert any(row[3] == "pruned" for row in h1), h1  # the racing pruner did stop someone
    assert h1 == h32 and s1 == s32
    # The same calls, but for answers given ahead of a pruning decision (lookahead): task calls of
    # pruned candidates, at most one minibatch (2 questions) each beyond what one worker asked.
    extra = list((Counter(c32) - Counter(c1)).elements())
    assert not Counter(c1) - Counter(c32)
    pruned = {row[1] for row in h32 if row[3] == "pruned"}
    assert all(any(call.startswith(ins + "\n") for ins in pruned) for call in extra), extra
    assert len(extra) <= 2 * len(pruned)
    assert t1 == "budget" and b1 == b32 and d1 == d32 and t1 == t32


def test_workers_racing_to_create_the_schema_of_a_fresh_store_all_open_it(tmp_path: Path) -> None:
    """The loser of the schema race sees the winner's alembic_version row (IntegrityError) or its
    tables (OperationalError): both are retried, 20 fresh stores opened by 2 threads at one instant."""
    from opro.search import open_storage

    for i in range(20):
        url = f"sqlite:///{tmp_path / f'optuna-{i}.db'}"
        errors = run_together(lambda _, url=url: open_storage(url).engine.dispose())  # type: ignore[attr-defined]
        assert not errors, (i, errors)


def test_a_lost_schema_race_is_retried_and_a_foreign_file_or_a_denied_user_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    from opro.errors import ConfigError
    from opro.search import open_storage

    real = optuna.storages.RDBStorage
    attempts: list[str] = []
    lost = [  # what the loser of fresh workers sees: SQLite's, then PostgreSQL's (a table created meanwhile)
        IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed: alembic_version.version_num")),
        ProgrammingError("CREATE TABLE studies", {}, Exception('relation "studies" already exists')),
    ]

    def loses_the_race_twice(url: str, **kwargs: object) -> optuna.storages.RDBStorage:
        attempts.append(url)
        if len(attempts) <= len(lost):
            raise lost[len(attempts) - 1]
        return real(url, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna.storages, "RDBStorage", loses_the_race_twice)
    open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(attempts) == 3

    def denied(url: str, **kwargs: object) -> optuna.storages.RDBStorage:
        attempts.append(url)
        raise ProgrammingError("CREATE TABLE studies", {}, Exception("permission denied for schema public"))

    monkeypatch.setattr(optuna.storages, "RDBStorage", denied)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"permission denied for schema public; check that the URL's user may create") as err:
        open_storage("postgresql+psycopg2://opro:secret@db.example/opro")
    assert "secret" not in str(err.value)
    assert len(attempts) == 4 and time.perf_counter() - started < 0.4  # not a race: refused at once
    monkeypatch.setattr(optuna.storages, "RDBStorage", real)
    foreign = tmp_path / "notes.db"
    foreign.write_text("not a database, but a text file of some length " * 100)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"notes.db.*point it at a new file"):
        open_storage(f"sqlite:///{foreign}")
    assert time.perf_counter() - started < 0.4  # refused at once, not after the race's retries
