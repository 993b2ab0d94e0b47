"""The study store: opened from its URL, and a study archived so that the next run starts fresh."""

from __future__ import annotations

from pathlib import Path

import optuna

from opro.search import SearchStudy
from opro.search.storage import archive_study, open_storage


def test_archiving_a_study_keeps_a_copy_and_frees_its_name(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = SearchStudy.open(storage, name="run")
    study.save_summary({"best": "kept"})
    attrs = dict(study.optuna.user_attrs)
    archived = archive_study(storage, name="run")
    assert archived is not None and archived.startswith("run-archived-")
    assert SearchStudy.load(storage, name="run") is None  # the next run starts a fresh study
    copy = SearchStudy.load(storage, name=archived)
    assert copy is not None and copy.optuna.user_attrs == attrs and attrs
    assert archive_study(storage, name="run") is None  # nothing left to archive
    assert {s.study_name for s in optuna.get_all_study_summaries(storage)} == {archived}
