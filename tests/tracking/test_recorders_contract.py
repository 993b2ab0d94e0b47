"""The contract every search recorder (:class:`opro.search.recorder.Recorder`) must keep, run against each
implementation as Optuna's storage suite is run against every storage: the run directory's, MLflow's
(over a SQLite store) and a minimal one written here (what a new tracker needs to do, and no more).

A recorder takes the whole event sequence of a scripted search (meta-prompts, steps, the validation
stage's batches and prompts, the result), records nothing twice when the finished study is run
again by a fresh recorder (a resume), says where it recorded (:meth:`Recorder.recorded`, the same
place after the resume), and survives a failed search (ending twice is safe).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakes import Ex, keyword_examples, keyword_optimizer

from opro.recorders import RunDirRecorder
from opro.records import Recorded
from opro.rundir import RunDir
from opro.search.recorder import Recorder
from opro.search.results import CandidateRecord, OptimizationResult
from opro.search.study import SearchStudy

INITIAL = "Answer the question."


class MemoryRecorder(Recorder):
    """The smallest recorder that keeps the contract: records in ``store`` (a list that outlives the
    recorder, as a tracker's server does), and what it recorded in the study (its own keys), so a
    resume records nothing twice."""

    name = "memory"

    def __init__(self, store: list[tuple[str, Any]]) -> None:
        self.store = store
        self._study: str | None = None

    def on_search_start(self, study: SearchStudy, *, lead: bool) -> None:
        self._study = study.name

    def on_step(self, study: SearchStudy, *, step: int, history: Sequence[CandidateRecord], best_score: float) -> None:
        logged = list(study.recorder_state("memory_logged") or [])
        if step not in logged:
            self.store.extend(("candidate", (r.step, r.instruction, r.score)) for r in history if r.step == step)
            study.set_recorder_state("memory_logged", [*logged, step])

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        digest = hashlib.sha256(json.dumps(result.best_instruction).encode()).hexdigest()
        if study.recorder_state("memory_result") != digest:
            self.store.append(("result", result.best_instruction))
            study.set_recorder_state("memory_result", digest)

    def recorded(self) -> Recorded | None:
        if self._study is None:
            return None
        return Recorded(recorder=self.name, ref=self._study, where=f"memory store of study {self._study}")


@dataclass
class Kind:
    """One implementation: how to make a fresh instance over the same store, and what it has stored."""

    make: Callable[[], Recorder]
    stored: Callable[[], Any]
    check_where: Callable[[Recorded], None] = lambda r: None
    store: list[Any] = field(default_factory=list)


def _run_dir(tmp_path: Path) -> Kind:
    out = RunDir(tmp_path / "recorded")

    def stored() -> dict[str, Any]:
        files = sorted(p for p in out.root.rglob("*") if p.is_file())
        return {p.relative_to(out.root).as_posix(): p.read_bytes() if p.suffix != ".png" else "png" for p in files}

    def check(r: Recorded) -> None:
        assert Path(r.ref) == out.root and (out.root / "history.jsonl").is_file()

    return Kind(make=lambda: RunDirRecorder(out), stored=stored, check_where=check)


def _mlflow(tmp_path: Path) -> Kind:
    from mlflow import MlflowClient

    from opro.tracking.mlflow import MlflowTracker
    from opro.tracking.recorder import MlflowRecorder

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = RunDir(tmp_path / "artifacts")
    out.root.mkdir(parents=True)

    def make() -> Recorder:
        return MlflowRecorder(MlflowTracker(tracking_uri=uri, experiment_name="contract"), params={"seed": 0},
                              run_dir=out, register_prompt=("qa-contract", "best"), sidecar=False)

    def stored() -> dict[str, Any]:
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        return {
            "runs": sorted((r.info.run_id, r.info.status) for r in runs),
            "metrics": {(r.info.run_id, k): len(client.get_metric_history(r.info.run_id, k))
                        for r in runs for k in r.data.metrics},
            "versions": len(client.search_prompt_versions("qa-contract")),
        }

    def check(r: Recorded) -> None:
        from mlflow import MlflowClient

        assert MlflowClient(tracking_uri=uri).get_run(r.ref).info.status == "FINISHED"
        assert r.where == f"MLflow run {r.ref} in {uri}"  # what `opro optimize` prints, as it always has

    return Kind(make=make, stored=stored, check_where=check)


def _memory(tmp_path: Path) -> Kind:
    store: list[tuple[str, Any]] = []
    return Kind(make=lambda: MemoryRecorder(store), stored=lambda: list(store), store=store)


KINDS: dict[str, Callable[[Path], Kind]] = {"run_dir": _run_dir, "mlflow": _mlflow, "memory": _memory}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Kind:
    return KINDS[request.param](tmp_path)


class Events(Recorder):
    """Which hooks the search called, in order (placed after the recorder under test)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("on_") and callable(attr):
            object.__getattribute__(self, "seen").append(name)
        return attr


def _search(tmp_path: Path, *recorders: Recorder) -> OptimizationResult:
    opt, _, program = keyword_optimizer(tmp_path, steps=2, candidates_per_step=3, minibatch_size=3, finalists=2)
    opt.recorders = tuple(recorders)
    return opt.optimize(program=program, optimization_set=keyword_examples(6), exemplar_set=[Ex("exemplar?", "yes")],
                        validation_set=[Ex(f"validation {i}?", f"ref{i}") for i in range(8)],
                        initial_instructions=[INITIAL])


def test_a_recorder_takes_every_event_of_a_search_and_says_where_it_recorded(kind: Kind, tmp_path: Path) -> None:
    recorder, events = kind.make(), Events()
    for r in (recorder, events):
        r.prepare(lead=True)
    result = _search(tmp_path, recorder, events)
    assert {"on_search_start", "on_meta_prompt", "on_step", "on_search_end", "on_validation_batch", "on_validated",
            "on_validation_end", "on_result"} <= set(events.seen), events.seen
    assert events.seen.index("on_result") == len(events.seen) - 1
    assert result.history and kind.stored()
    where = recorder.recorded()
    assert isinstance(where, Recorded) and where.recorder and where.ref and where.where
    kind.check_where(where)


def test_a_resumed_recorder_records_nothing_twice_and_the_same_place(kind: Kind, tmp_path: Path) -> None:
    first = kind.make()
    first.prepare(lead=True)
    result = _search(tmp_path, first)
    before, where = kind.stored(), first.recorded()

    again = kind.make()  # a rerun of the finished study: a fresh recorder over the same stores
    again.prepare(lead=True)
    rerun = _search(tmp_path, again)
    assert rerun.best_instruction == result.best_instruction
    assert kind.stored() == before
    assert again.recorded() == where


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("the endpoint broke")])
def test_a_recorder_survives_a_failed_search_and_a_second_discard(
    kind: Kind, tmp_path: Path, error: BaseException
) -> None:
    from opro.search.study import open_storage

    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'failed.db'}"), name="failed")
    recorder = kind.make()
    recorder.prepare(lead=True)
    recorder.on_search_start(study, lead=True)
    recorder.on_search_failed(study, error, abandoned=False)
    recorder.discard()
    recorder.discard()


def test_a_recorder_may_not_store_under_the_searchs_own_keys(tmp_path: Path) -> None:
    from opro.search.study import open_storage

    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'keys.db'}"), name="keys")
    for key in ("fingerprint", "summary", "proposals:3", "holder:w0", "validation:ab:cd"):
        with pytest.raises(ValueError, match="search"):
            study.set_recorder_state(key, 1)
    study.set_recorder_state("memory_logged", [1, 2])
    assert study.recorder_state("memory_logged") == [1, 2] and study.recorder_state("unset") is None
