"""MLflow stores: a new SQLite store starts from a copy of an empty migrated one, and works like one."""

from __future__ import annotations

from pathlib import Path

import pytest

from opro.tracking.mlflow import MlflowTracker, _empty_store_path


def test_a_new_store_is_a_copy_of_an_empty_one_and_keeps_nothing_of_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    first = MlflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", experiment_name="a")
    first.start(run_name="r", params={"x": 1})
    first.finish()
    assert _empty_store_path().is_file()  # kept when the first store was built, before anything was in it

    second = MlflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", experiment_name="b")
    run_id = second.start(run_name="r", params={"y": 2})
    second.log_metrics({"m": 1.0}, step=0)
    second.finish()
    client = second.client
    assert [e.name for e in client.search_experiments()] == ["b", "Default"]
    assert client.get_run(run_id).data.params == {"y": "2"}
    assert client.get_experiment("0").artifact_location == str(tmp_path / "mlruns" / "0")


def test_a_failed_search_still_ends_when_the_mlflow_sidecar_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The search's own error is what reaches the user, not the sidecar's: ending the run is best effort."""
    import os
    import signal

    from opro.tracking.recorder import MlflowRecorder

    tracking = MlflowRecorder(MlflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="e"),
                              sidecar=True)
    from opro.search.storage import open_storage
    from opro.search.study import SearchStudy

    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"), name="s")
    tracking.on_search_start(study, lead=True)  # type: ignore[arg-type]
    tracking._drain()  # the run started, in the child
    assert tracking.sidecar is not None and tracking.tracker.run_id
    os.kill(tracking.sidecar._process.pid, signal.SIGKILL)
    tracking.sidecar._process.wait(timeout=30)
    with caplog.at_level("WARNING", logger="opro.tracking.recorder"):
        tracking.on_search_failed(study, RuntimeError("the search broke"), abandoned=False)  # type: ignore[arg-type]
    assert "could not be ended" in caplog.text and "process ended during tracker.finish" in caplog.text


@pytest.mark.parametrize("template", ["cold", "warm"])
def test_workers_opening_a_new_store_at_the_same_instant_both_get_it(
    template: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers of a fresh run open the MLflow store behind a barrier: built from scratch (no empty
    store kept yet: MLflow's migrations) and copied from the kept empty store. Neither fails, both see
    one store."""
    from fakes import run_together

    from opro.tracking.mlflow import _client

    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path / "cache"))
    if template == "warm":
        _client(f"sqlite:///{tmp_path / 'seed' / 'mlflow.db'}")
        assert _empty_store_path().is_file()
    uri = f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}"
    names: list[list[str]] = []
    errors = run_together(lambda _: names.append([e.name for e in _client(uri).search_experiments()]), timeout_s=120)
    assert not errors, errors
    assert names == [["Default"], ["Default"]]
