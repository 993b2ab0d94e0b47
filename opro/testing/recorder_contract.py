"""The contract every search recorder (:class:`opro.search.records.Recorder`) must keep, as Optuna's
storage suite is run against every storage.

A recorder takes the whole event sequence of a scripted search in the keyword world
(:mod:`opro.testing.worlds`: meta-prompts, steps, the validation stage's batches and prompts, the
result), records nothing twice when the finished study is run again by a fresh recorder (a resume), says
where it recorded (:meth:`~opro.search.records.Recorder.recorded`, the same place after the resume), and
survives a failed search (ending twice is safe).

A plug-in's tests run it by importing the tests and giving a ``kind`` fixture (a :class:`Kind`: how to
make a fresh recorder over the same store, and what that store holds)::

    from opro.testing.recorder_contract import *  # noqa: F403

    @pytest.fixture
    def kind(tmp_path):
        return Kind(make=lambda: MyRecorder(tmp_path / "store"), stored=lambda: read(tmp_path / "store"))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from opro.search.records import Recorded, Recorder
from opro.search.results import OptimizationResult
from opro.search.study import SearchStudy
from opro.testing.worlds import Ex, keyword_examples, keyword_optimizer

INITIAL = "Answer the question."


@dataclass
class Kind:
    """One implementation: how to make a fresh instance over the same store, and what it has stored."""

    make: Callable[[], Recorder]
    stored: Callable[[], Any]
    check_where: Callable[[Recorded], None] = lambda r: None
    store: list[Any] = field(default_factory=list)


class Events(Recorder):
    """Which hooks the search called, in order (placed after the recorder under test)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("on_") and callable(attr):
            object.__getattribute__(self, "seen").append(name)
        return attr


def run_search(tmp_path: Path, *recorders: Recorder) -> OptimizationResult:
    opt, _, program = keyword_optimizer(tmp_path, steps=2, candidates_per_step=3, minibatch_size=3, finalists=2)
    opt.recorders = tuple(recorders)
    return opt.optimize(program=program, optimization_set=keyword_examples(6), exemplar_set=[Ex("exemplar?", "yes")],
                        validation_set=[Ex(f"validation {i}?", f"ref{i}") for i in range(8)],
                        initial_instructions=[INITIAL])


def test_a_recorder_takes_every_event_of_a_search_and_says_where_it_recorded(kind: Kind, tmp_path: Path) -> None:
    recorder, events = kind.make(), Events()
    for r in (recorder, events):
        r.prepare(lead=True)
    result = run_search(tmp_path, recorder, events)
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
    result = run_search(tmp_path, first)
    before, where = kind.stored(), first.recorded()

    again = kind.make()  # a rerun of the finished study: a fresh recorder over the same stores
    again.prepare(lead=True)
    rerun = run_search(tmp_path, again)
    assert rerun.best_instruction == result.best_instruction
    assert kind.stored() == before
    assert again.recorded() == where


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("the endpoint broke")])
def test_a_recorder_survives_a_failed_search_and_a_second_discard(
    kind: Kind, tmp_path: Path, error: BaseException
) -> None:
    from opro.search.storage import open_storage

    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'failed.db'}"), name="failed")
    recorder = kind.make()
    recorder.prepare(lead=True)
    recorder.on_search_start(study, lead=True)
    recorder.on_search_failed(study, error, abandoned=False)
    recorder.discard()
    recorder.discard()


def test_a_recorder_may_not_store_under_the_searchs_own_keys(tmp_path: Path) -> None:
    from opro.search.storage import open_storage

    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'keys.db'}"), name="keys")
    for key in ("fingerprint", "summary", "proposals:3", "holder:w0", "validation:ab:cd"):
        with pytest.raises(ValueError, match="search"):
            study.set_recorder_state(key, 1)
    study.set_recorder_state("memory_logged", [1, 2])
    assert study.recorder_state("memory_logged") == [1, 2] and study.recorder_state("unset") is None


__all__ = [
    "Events",
    "Kind",
    "run_search",
    "test_a_recorder_may_not_store_under_the_searchs_own_keys",
    "test_a_recorder_survives_a_failed_search_and_a_second_discard",
    "test_a_recorder_takes_every_event_of_a_search_and_says_where_it_recorded",
    "test_a_resumed_recorder_records_nothing_twice_and_the_same_place",
]
