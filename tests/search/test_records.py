"""The command recording seam: every recorder of commands passes one contract; MLflow is one of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from opro.search.records import CommandRecord, Recorded, Recorder, finite_metrics, record_all
from opro.testing import MemoryRecorder
from opro.tracking.commands import MlflowCommandRecorder


def _mlflow(tmp_path: Path) -> MlflowCommandRecorder:
    return MlflowCommandRecorder(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="records")


RECORDERS: dict[str, Callable[[Path], Recorder]] = {"list": lambda _: MemoryRecorder(), "mlflow": _mlflow}


@pytest.mark.parametrize("make", RECORDERS.values(), ids=list(RECORDERS))
def test_every_command_recorder_records_and_says_where(make: Callable[[Path], Recorder], tmp_path: Path) -> None:
    recorder = make(tmp_path)
    assert isinstance(recorder, Recorder)
    report = tmp_path / "probe.json"
    report.write_text("{}", encoding="utf-8")
    record = CommandRecord(kind="probe", name="probe", params={"questions": 8}, metrics={"effect_none": -0.1},
                           tags={"opro.data.dataset": "x"}, files={report: "probe"})
    first, second = record_all([recorder], record) + record_all([recorder], record)
    assert first.recorder == recorder.name and first.where and first.ref
    assert first.ref != second.ref  # two records are two entries, never one overwritten


def test_mlflow_records_a_command_as_one_tagged_run_with_its_files(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    report = tmp_path / "probe.md"
    report.write_text("# probe\n", encoding="utf-8")
    recorder = _mlflow(tmp_path)
    (done,) = record_all([recorder], CommandRecord(
        kind="probe", name="probe", params={"questions": 8},
        metrics=finite_metrics({"effect_none": -0.125, "missing": None, "nan": float("nan")}), files={report: "probe"}))
    run = MlflowClient(recorder.tracking_uri).get_run(done.ref)
    assert run.data.tags["opro.kind"] == "probe" and run.info.status == "FINISHED"
    assert run.data.metrics == {"effect_none": -0.125} and run.data.params == {"questions": "8"}
    listed = MlflowClient(recorder.tracking_uri).list_artifacts(done.ref, "probe")
    assert [Path(a.path).name for a in listed] == ["probe.md"]
    assert done.where == f"MLflow run {done.ref} in {recorder.tracking_uri}"


def test_a_folder_among_the_files_stands_for_the_files_in_it(tmp_path: Path) -> None:
    """A command that writes a report folder (compare) records the folder: its files, as they lie,
    at the record's root or under the folder named."""
    from mlflow import MlflowClient

    reports = tmp_path / "reports"
    (reports / "plots").mkdir(parents=True)
    (reports / "report.md").write_text("# compare\n", encoding="utf-8")
    (reports / "plots" / "scores.csv").write_text("question,a\n", encoding="utf-8")
    recorder = _mlflow(tmp_path)
    client = MlflowClient(recorder.tracking_uri)
    for folder, top in ((None, ["plots", "report.md"]), ("compare", ["compare/plots", "compare/report.md"])):
        (done,) = record_all([recorder], CommandRecord(kind="comparison", name="compare", files={reports: folder}))
        assert sorted(a.path for a in client.list_artifacts(done.ref, folder)) == top
        inner = "plots" if folder is None else f"{folder}/plots"
        assert [a.path for a in client.list_artifacts(done.ref, inner)] == [f"{inner}/scores.csv"]


def test_a_recorder_that_fails_marks_its_run_failed_and_never_shows_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class Tracker:
        def __init__(self, **kwargs: Any) -> None:
            calls.append(("init", kwargs))

        def start(self, **kwargs: Any) -> str:
            return "run1"

        def set_tags(self, tags: Any) -> None:
            pass

        def log_metrics(self, metrics: Any, *, step: int) -> None:
            raise OSError("store is full")

        def finish(self, *, status: str = "FINISHED") -> None:
            calls.append(("finish", status))

    monkeypatch.setattr("opro.tracking.commands.MlflowTracker", Tracker)
    recorder = MlflowCommandRecorder(tracking_uri="https://user:hunter2@mlflow.example/", experiment_name="e")
    with pytest.raises(OSError, match="store is full"):
        recorder.record(CommandRecord(kind="probe", name="probe", metrics={"x": 1.0}))
    assert calls[-1] == ("finish", "FAILED")
    monkeypatch.setattr(Tracker, "log_metrics", lambda self, metrics, *, step: None)
    done = recorder.record(CommandRecord(kind="probe", name="probe", metrics={"x": 1.0}))
    assert "hunter2" not in done.where and "mlflow.example" in done.where


def test_each_recorder_hears_where_the_ones_before_it_recorded() -> None:
    """What lets a recorder link to another's record (an evaluation run to its command's MLflow run);
    a recorder with nothing of the record to keep says None and is left out."""

    class Nothing:
        name = "nothing"

        def record(self, record: CommandRecord) -> Recorded | None:
            return None

    first, second = MemoryRecorder(), MemoryRecorder()
    record = CommandRecord(kind="probe", name="probe")
    recorded = record_all([first, Nothing(), second], record)
    assert [r.ref for r in recorded] == ["1", "1"] and len(recorded) == 2
    assert first.records == [record] and second.records[0].earlier == (recorded[0],)
