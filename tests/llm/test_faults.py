"""Fault injection through the network path: a loopback OpenAI-compatible server, real `opro optimize`
processes. Permanent errors stop at once, naming the role and the server; two runs on one folder
cannot race; Ctrl-C says how to resume; MLflow store creation survives a concurrent start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from children import argv
from fakes import FAULT_KEY as KEY
from fakes import experiment_config, write_toml
from fakes import opro_process as _opro
from fault_server import FaultServer


def _fault_config(tmp_path: Path, server: FaultServer, *, timeout_s: float = 30.0, **overrides: dict) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = experiment_config(tmp_path, **overrides)
    for role in ("task", "judge", "optimizer", "generator"):
        cfg["models"][role] = {
            "backend": "openai", "model": f"{'optimizer' if role == 'generator' else role}-model",
            "base_url": server.base_url, "api_key_env": "OPRO_FAULT_KEY", "max_concurrency": 2,
            "timeout_s": timeout_s,
        }
    cfg["experiment"]["progress"] = False
    return write_toml(cfg, tmp_path / "exp.toml")


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


@pytest.mark.parametrize("fault", ["500", "503", "429", "timeout", "reset", "malformed", "empty"])
def test_transient_faults_are_retried_and_the_run_completes(tmp_path: Path, fault: str) -> None:
    with FaultServer(key=KEY) as server:
        config = _fault_config(tmp_path, server, timeout_s=1.0)
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
    # The retries are reported; library chatter (MLflow's store creation, bm25s' DEBUG lines) is not.
    assert "Creating initial MLflow database tables" not in out and "DEBUG" not in out, out


@pytest.mark.parametrize("fault", ["400", "404"])
def test_a_bad_request_or_unknown_model_stops_at_the_first_call(tmp_path: Path, fault: str) -> None:
    with FaultServer(key=KEY) as server:
        server.faults["task"] = fault
        config = _fault_config(tmp_path, server)
        proc = _opro("optimize", str(config), "--no-progress")
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "task model:" in out and server.base_url in out and "fix [models.task]" in out and "Traceback" not in out
    assert server.counts["task"] <= 2 and server.counts["judge"] == 0 and server.counts["optimizer"] == 0


def _history(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "out" / "history.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("step", "instruction", "score", "status", "scores")} for r in rows]


def test_kill_9_at_several_points_then_a_rerun_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    with FaultServer(key=KEY) as server:
        reference = _opro("optimize", str(_fault_config(tmp_path / "ref", server)), "--no-progress")
        out, _ = reference.communicate(timeout=240)
        assert reference.returncode == 0, out
        config = _fault_config(tmp_path / "run", server)
        server.latency_s = 0.05
        killed = 0
        for point in (2, 8, 12, 15):  # requests into each process: each resumes, then is killed further on
            start = sum(server.counts.values())
            proc = _opro("optimize", str(config), "--no-progress")
            deadline = time.monotonic() + 60
            while sum(server.counts.values()) - start < point and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            if proc.poll() is None:
                proc.kill()
                killed += 1
            proc.communicate(timeout=30)
        assert killed >= 3
        server.latency_s = 0.0
        final = _opro("optimize", str(config), "--no-progress")
        out, _ = final.communicate(timeout=240)
        assert final.returncode == 0, out
    assert _history(tmp_path / "run") == _history(tmp_path / "ref")
    summary = json.loads((tmp_path / "run" / "out" / "summary.json").read_text())
    assert summary["validated"] and summary["best_score"] == json.loads(
        (tmp_path / "ref" / "out" / "summary.json").read_text())["best_score"]


def _second_is_refused_while_first_runs(server: FaultServer, first_cfg: Path, second_cfg: Path, *, refusal: str) -> None:
    """Starts `second_cfg` once `first_cfg` has reached the judge; it must stop at once with `refusal` and the
    holder's pid, the first must finish, and a later run of `second_cfg` must resume without a new call."""
    first = _opro("optimize", str(first_cfg), "--no-progress")
    deadline = time.monotonic() + 60
    while server.counts["judge"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Hold the first run's requests while the second starts (its imports can take long on a loaded
    # machine): the first must still be running when the second asks for the lock.
    latency = server.latency_s
    server.latency_s = 5.0
    second = _opro("optimize", str(second_cfg), "--no-progress")
    out2, _ = second.communicate(timeout=120)
    server.latency_s = latency
    out1, _ = first.communicate(timeout=240)
    assert first.returncode == 0, out1
    assert second.returncode == 1, out2
    assert refusal in out2 and f"pid {first.pid}" in out2
    calls = sum(server.counts.values())
    again = _opro("optimize", str(second_cfg), "--no-progress")
    out3, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out3
    assert sum(server.counts.values()) == calls


def test_two_runs_on_one_folder_one_is_refused_at_once(tmp_path: Path) -> None:
    with FaultServer(key=KEY, latency_s=0.05) as server:
        config = _fault_config(tmp_path, server)
        # The folder stays usable afterwards.
        _second_is_refused_while_first_runs(server, config, config, refusal="is in use by another opro process")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_says_how_to_resume_and_the_rerun_resumes(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C, and SIGTERM (kill, a scheduler's stop: it ended the run with 143 and not a word), keep what
    finished, say how to resume, exit 128 + the signal (the shell's convention); the rerun finishes."""
    with FaultServer(key=KEY, latency_s=0.2) as server:
        config = _fault_config(tmp_path, server)
        proc = _opro("optimize", str(config), "--no-progress")
        deadline = time.monotonic() + 60
        while server.counts["judge"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, out
        said = " ".join(out.split())
        assert "interrupted" in said and f"rerun `opro optimize {config}` to resume" in said, out
        assert "Traceback" not in out
        server.latency_s = 0.0
        again = _opro("optimize", str(config), "--no-progress")
        out, _ = again.communicate(timeout=240)
    assert again.returncode == 0, out


def test_the_same_model_on_another_port_answers_from_the_call_cache(tmp_path: Path) -> None:
    """Issue 66: the call cache was keyed by the server's URL, so the same model served on another port
    asked every call again; it is keyed by the model (its name and the request), as the ledger is."""
    with FaultServer(key=KEY) as first:
        config = _fault_config(tmp_path / "a", first)
        proc = _opro("optimize", str(config), "--no-progress")
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
        assert first.counts["task"] > 0
    cache = tmp_path / "a" / "calls.sqlite"
    with FaultServer(key=KEY) as second:
        assert second.base_url != first.base_url
        # Another output folder and copy of the dataset, on the first run's call cache.
        moved = _fault_config(tmp_path / "b", second, experiment={"name": "t", "output_dir": "out",
                                                                  "cache_path": str(cache), "progress": False})
        proc = _opro("optimize", str(moved), "--no-progress")
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
        assert second.counts["task"] == 0 and sum(second.counts.values()) == 0, second.counts
    a, b = (json.loads((tmp_path / run / "out" / "summary.json").read_text()) for run in ("a", "b"))
    assert b["best_score"] == a["best_score"] and b["best_instruction"] == a["best_instruction"]


def test_concurrent_mlflow_store_creation_leaves_a_usable_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [subprocess.Popen(argv("mlflow_run", uri, f"e{i}"), stderr=subprocess.PIPE, text=True) for i in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    from mlflow import MlflowClient

    names = {e.name for e in MlflowClient(tracking_uri=uri).search_experiments()}
    assert {"e0", "e1", "e2"} <= names


def test_a_store_left_mid_migration_is_repaired(tmp_path: Path) -> None:
    import sqlite3

    from opro.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowTracker(tracking_uri=uri, experiment_name="a").start(run_name="r", params={})
    with sqlite3.connect(tmp_path / "mlflow.db") as conn:  # what an interrupted migration leaves behind
        conn.execute("CREATE TABLE _alembic_tmp_tags (key VARCHAR(250))")
    tracker = MlflowTracker(tracking_uri=uri, experiment_name="b")
    tracker.start(run_name="r", params={})
    tracker.finish()
    with sqlite3.connect(tmp_path / "mlflow.db") as conn:
        left = conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '_alembic_tmp_%'").fetchall()
    assert left == []


def test_two_folders_on_one_study_one_is_refused_at_once(tmp_path: Path) -> None:
    """Workers on several machines share a study through its storage, not a folder: the lease is in the study."""
    shared = {"optuna_storage": f"sqlite:///{tmp_path / 'shared-optuna.db'}", "study_name": "shared"}
    with FaultServer(key=KEY, latency_s=0.5) as server:
        first_cfg = _fault_config(tmp_path / "a", server, tracking={"prompt_name": "qa-test", **shared})
        second_cfg = _fault_config(tmp_path / "b", server, tracking={"prompt_name": "qa-test", **shared})
        # Released at the end: the other folder can then resume the finished study.
        _second_is_refused_while_first_runs(
            server, first_cfg, second_cfg, refusal="study 'shared' is being run by another opro process"
        )


def test_a_dead_holder_s_study_lease_is_taken_over(tmp_path: Path) -> None:
    from opro.locking import LockedError, StudyLease
    from opro.search.storage import open_storage
    from opro.search.study import SearchStudy

    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 's.db'}"), name="s")
    slot = study.lease_slot(0)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with StudyLease(slot, what="study 's'"), pytest.raises(LockedError, match=rf"pid {os.getpid()}"):
        StudyLease(slot, what="study 's'").__enter__()
    slot.write({"host": socket.gethostname(), "pid": int(dead.stdout), "token": "x", "beat": 0})
    with StudyLease(slot, what="study 's'"):  # its holder exited: taken over at once
        pass
    slot.write({"host": "elsewhere", "pid": 1, "token": "y", "beat": time.time()})
    with pytest.raises(LockedError, match="on elsewhere"):
        StudyLease(slot, what="study 's'").__enter__()
    slot.write({"host": "elsewhere", "pid": 1, "token": "y", "beat": time.time() - 301})
    with StudyLease(slot, what="study 's'"):  # no heartbeat for 5 minutes: stale
        pass


def test_the_loopback_server_answers_in_its_latency_without_a_delayed_ack_stall() -> None:
    """The benchmarks read their ratios off this server's latency: a reply written as headers then
    body must not wait for the client's delayed ACK (40 ms on Linux) on a kept-alive connection."""
    import http.client
    import json
    import statistics
    from urllib.parse import urlsplit

    with FaultServer(key=KEY, keep_alive=True) as server:
        url = urlsplit(f"{server.base_url}/chat/completions")
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)  # one kept-alive connection
        took = []
        try:
            for i in range(15):
                body = json.dumps({"model": "task-model", "messages": [{"role": "user", "content": f"q{i}"}]})
                started = time.perf_counter()
                conn.request("POST", url.path, body=body.encode(),
                             headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                took.append(time.perf_counter() - started)
                assert reply.status == 200
        finally:
            conn.close()
    assert statistics.median(took) < 0.025, f"median {statistics.median(took) * 1000:.0f} ms per request"
