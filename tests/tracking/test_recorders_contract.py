"""The search recorder contract (:mod:`opro.testing.recorder_contract`), run against each implementation
as Optuna's storage suite is run against every storage: the run directory's, MLflow's (over a SQLite
store) and the in-memory one of :mod:`opro.testing` (what a new tracker needs to do, and no more)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from opro.paths import RunDir
from opro.search.records import Recorded, Recorder
from opro.testing import MemoryRecorder
from opro.testing.recorder_contract import *  # noqa: F403
from opro.testing.recorder_contract import Kind
from opro.tracking.rundir_recorder import RunDirRecorder


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
