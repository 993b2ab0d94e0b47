"""Fault injection through the network path: a loopback OpenAI-compatible server, real `opro optimize`
processes. Permanent errors stop at once, naming the role and the server; two runs on one folder
cannot race; Ctrl-C says how to resume; MLflow store creation survives a concurrent start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_server import FaultServer
from test_cli import _write_toml
from test_experiment import _config

KEY = "sk-fault-test-0123456789abcdef"


def _fault_config(tmp_path: Path, server: FaultServer, **overrides: dict) -> Path:
    cfg = _config(tmp_path, **overrides)
    for role in ("task", "judge", "optimizer", "generator"):
        cfg["models"][role] = {
            "backend": "openai", "model": f"{'optimizer' if role == 'generator' else role}-model",
            "base_url": server.base_url, "api_key_env": "OPRO_FAULT_KEY", "max_concurrency": 2,
        }
    cfg["experiment"]["progress"] = False
    return _write_toml(cfg, tmp_path / "exp.toml")


def _opro(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "OPRO_FAULT_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.Popen(
        [sys.executable, "-c", "from opro.cli import main; main()", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kwargs,  # type: ignore[call-overload]
    )


def test_a_bad_judge_key_stops_at_the_first_judge_call(tmp_path: Path) -> None:
    with FaultServer(key=KEY) as server:
        server.faults["judge"] = "401"
        config = _fault_config(tmp_path, server)
        proc = _opro("optimize", str(config), "--no-progress")
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "judge model: authentication failed (401)" in out and server.base_url in out
    assert "fix [models.judge]" in out and "Traceback" not in out
    # Nothing else was paid for after the judge's first refusal (beyond the calls already in flight:
    # max_concurrency 2), and the optimizer was never called.
    assert server.counts["judge"] <= 2 and server.counts["task"] <= 2 and server.counts["optimizer"] == 0


@pytest.mark.parametrize("fault", ["500", "503", "429", "reset", "malformed", "empty"])
def test_transient_faults_are_retried_and_the_run_completes(tmp_path: Path, fault: str) -> None:
    with FaultServer(key=KEY) as server:
        config = _fault_config(tmp_path, server)
        # Fault the judge for its first requests only: a flaky endpoint, not a dead one.
        server.faults["judge"] = fault
        proc = _opro("optimize", str(config), "--no-progress")
        deadline = time.monotonic() + 30
        while server.counts["judge"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        server.faults.pop("judge")
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["validated"] and summary["initial_score"] == 2.0


def test_two_runs_on_one_folder_one_is_refused_at_once(tmp_path: Path) -> None:
    with FaultServer(key=KEY, latency_s=0.05) as server:
        config = _fault_config(tmp_path, server)
        first = _opro("optimize", str(config), "--no-progress")
        deadline = time.monotonic() + 60
        while sum(server.counts.values()) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = _opro("optimize", str(config), "--no-progress")
        out2, _ = second.communicate(timeout=60)
        out1, _ = first.communicate(timeout=240)
        assert first.returncode == 0, out1
        assert second.returncode == 1, out2
        assert "is in use by another opro process" in out2 and f"pid {first.pid}" in out2
        # The folder stays usable: a rerun on the same server finishes without a new call.
        calls = sum(server.counts.values())
        rerun = _opro("optimize", str(config), "--no-progress")
        out3, _ = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, out3
        assert sum(server.counts.values()) == calls


def test_ctrl_c_says_how_to_resume(tmp_path: Path) -> None:
    with FaultServer(key=KEY, latency_s=0.2) as server:
        config = _fault_config(tmp_path, server)
        proc = _opro("optimize", str(config), "--no-progress")
        deadline = time.monotonic() + 60
        while server.counts["judge"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out and f"opro optimize {config}" in out and "Traceback" not in out


def test_concurrent_mlflow_store_creation_leaves_a_usable_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = (
        "import sys; from opro.tracking import MlflowTracker; "
        "t = MlflowTracker(tracking_uri=sys.argv[1], experiment_name='e' + sys.argv[2]); "
        "t.start(run_name='r', params={}); t.finish()"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, str(i)], stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    from mlflow import MlflowClient

    names = {e.name for e in MlflowClient(tracking_uri=uri).search_experiments()}
    assert {"e0", "e1", "e2"} <= names
