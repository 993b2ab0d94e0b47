"""Scaling out as docs/scaling.md describes it: a real PostgreSQL and a real `mlflow server` on it, real
`opro optimize --worker I/N` processes (two at the start, one killed with SIGKILL and restarted, a third
joining late) against a loopback OpenAI-compatible server. The history is the single worker's, every
candidate is evaluated once, and `opro export best` works from another folder with the same stores.

PostgreSQL comes from the Debian package (``apt-get install postgresql``); the test starts a
throwaway cluster on 127.0.0.1 and stops it. In CI (``CI`` set) a missing server or driver fails.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from fakes import FAULT_KEY as KEY
from fakes import SearchRig, experiment_config, unavailable, write_toml
from fakes import opro_process as _opro
from fault_server import FaultServer

from opro.config import OptimizerSection
from opro.errors import ConfigError
from opro.llm import ChatClient, UsageLedger
from opro.llm.scripted import ScriptedLLM
from opro.search import open_storage

_missing = unavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 with databases ``opro`` and ``mlflow``: its base URL."""
    initdb = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not initdb:
        _missing("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        _missing('the PostgreSQL driver is not installed (pip install -e ".[postgres]")')
    bindir = Path(initdb[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="opro-pg-"))
    user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the Debian package's postgres user runs it
        user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    port = _free_port()
    data = root / "data"

    def run(*argv: str) -> None:
        subprocess.run([*user, *argv], check=True, capture_output=True, timeout=60)

    run(str(bindir / "initdb"), "-D", str(data), "-U", "opro", "--auth=trust", "-E", "UTF8", "--no-sync")
    run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
        "-o", f"-h 127.0.0.1 -p {port} -k {root} -F", "start")
    try:
        for db in ("opro", "mlflow"):
            run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "opro", db)
        yield f"postgresql+psycopg2://opro@127.0.0.1:{port}"
    finally:
        subprocess.run([*user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(postgres: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on the cluster's ``mlflow`` database, started as docs/scaling.md says."""
    port = _free_port()
    artifacts = tmp_path_factory.mktemp("mlflow-artifacts")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = (artifacts / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"{postgres}/mlflow",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--artifacts-destination", str(artifacts),
         "--allowed-hosts", f"127.0.0.1:{port},localhost:{port}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mlflow server did not start: {(artifacts / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def _worker_config(folder: Path, server: FaultServer, **tracking: Any) -> Path:
    """One machine's config: its own folder, dataset copy and call cache; the shared stores in [tracking]."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = experiment_config(folder, optimizer={"steps": 2, "candidates_per_step": 4, "minibatch_size": 2, "finalists": 1},
                  tracking=tracking)
    for role in ("task", "judge", "optimizer", "generator"):
        cfg["models"][role] = {
            "backend": "openai", "model": f"{'optimizer' if role == 'generator' else role}-model",
            "base_url": server.base_url, "api_key_env": "OPRO_FAULT_KEY", "max_concurrency": 2, "timeout_s": 30.0,
        }
    cfg["experiment"]["progress"] = False
    return write_toml(cfg, folder / "exp.toml")


def _history(folder: Path) -> list[tuple[Any, ...]]:
    rows = [json.loads(line) for line in (folder / "out" / "history.jsonl").read_text().splitlines()]
    return [(r["step"], r["index"], r["instruction"], r["score"], r["status"], r["scores"]) for r in rows]


def _finish(proc: subprocess.Popen[str], name: str, timeout: float) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{name}:\n{out}"
    return out


def test_workers_on_postgresql_and_an_mlflow_server_give_the_single_worker_history(
    tmp_path: Path, postgres: str, mlflow_server: str
) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        _scale_out(tmp_path, postgres, mlflow_server, procs)
    finally:
        for p in procs:  # a failed assertion must not leave workers running
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def _scale_out(
    tmp_path: Path, postgres: str, mlflow_server: str, procs: list[subprocess.Popen[str]]
) -> None:
    def opro(*args: str) -> subprocess.Popen[str]:
        procs.append(_opro(*args))
        return procs[-1]

    # A study of its own: the cluster lives as long as the module, and a rerun of this test (pytest-repeat)
    # must not meet the last run's study (another fault server's URL: its fingerprint refuses to resume).
    name = f"shared-{uuid.uuid4().hex[:8]}"
    with FaultServer(key=KEY, latency_s=0.3, distinct=True, max_requests=5000, lifetime_s=500) as server:
        reference = _worker_config(tmp_path / "single", server)  # one worker, local SQLite stores
        shared = {"optuna_storage": f"{postgres}/opro", "mlflow_uri": mlflow_server, "study_name": name,
                  "worker_wait_s": 60.0}
        configs = [_worker_config(tmp_path / f"machine{i}", server, **shared) for i in range(4)]
        single = opro("optimize", str(reference), "--no-progress")
        workers = {i: opro("optimize", str(configs[i]), "--worker", f"{i}/3", "--no-progress") for i in (0, 1)}

        # Kill worker 1 (SIGKILL: no clean-up) while it holds a claim on a candidate of step 1.
        storage = open_storage(f"{postgres}/opro")  # the workers may be creating its schema this instant
        deadline = time.monotonic() + 200
        while True:
            try:
                study = optuna.load_study(study_name=name, storage=storage)
                running = [t for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                           if t.user_attrs.get("worker") == 1 and t.user_attrs.get("step", 0) >= 1]
            except KeyError:
                running = []
            if running:
                break
            assert time.monotonic() < deadline and workers[1].poll() is None, "worker 1 never claimed a candidate"
            time.sleep(0.05)
        workers[1].kill()
        workers[1].communicate(timeout=30)
        killed_claims = {t.number for t in running}
        # A third worker joins, and worker 1 is restarted (a new process, a new lease).
        workers[2] = opro("optimize", str(configs[2]), "--worker", "2/3", "--no-progress")
        workers[1] = opro("optimize", str(configs[1]), "--worker", "1/3", "--no-progress")
        # While they run, a worker started with another N is refused before it evaluates anything.
        assert workers[0].poll() is None
        wrong = SearchRig(optimizer_llm=ChatClient(ScriptedLLM(), role="optimizer"), judge=None,
                          storage=f"{postgres}/opro", study_name=name, settings=OptimizerSection(finalists=0),
                          usage=UsageLedger())
        wrong.worker_index, wrong.num_workers = 3, 4
        with pytest.raises(ConfigError, match=r"--worker 0/3 .* started as --worker 3/4: every worker of a study"):
            wrong.optimize(program=None, optimization_set=[object()], initial_instructions=["x"])  # type: ignore[arg-type]
        outs = {i: _finish(p, f"worker {i}", 300) for i, p in workers.items()}
        _finish(single, "single worker", 300)

    assert _history(tmp_path / "machine0") == _history(tmp_path / "single"), outs[0]
    study = optuna.load_study(study_name=name, storage=storage)
    results: dict[tuple[int, ...], int] = {}
    parts: dict[tuple[int, ...], int] = {}
    for t in study.trials:
        a = t.user_attrs
        if a.get("status") is not None:  # a candidate's result, or a part of a split one (step 0)
            key = (a["step"], a["index"], *([a["part"]] if "part" in a else []))
            into = parts if "part" in a else results
            into[key] = into.get(key, 0) + 1
        if t.number in killed_claims:
            assert t.state == optuna.trial.TrialState.FAIL  # the killed worker's claim: taken over
    assert set(results.values()) == {1} and len(results) == len(_history(tmp_path / "single"))
    assert parts and set(parts.values()) == {1}, parts  # step 0 was shared question by question, each part once
    # Work was shared: worker 1 held a claim (the wait above), whoever finished the candidates. Which
    # worker evaluates what depends on how fast each process starts, so only the claims are asserted.
    claimed_by = {t.user_attrs["worker"] for t in study.trials if "worker" in t.user_attrs}
    assert {0, 1} <= claimed_by, claimed_by

    # The MLflow run on the server holds every worker's candidates and usage, and ended FINISHED.
    from mlflow import MlflowClient

    summary = json.loads((tmp_path / "machine0" / "out" / "summary.json").read_text())
    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    points = client.get_metric_history(run.info.run_id, "candidate_score")
    assert len(points) == sum(1 for row in _history(tmp_path / "single") if row[3] is not None)
    per_worker = [study.user_attrs.get(f"usage:w{i}") or {} for i in range(3)]
    assert summary["usage"]["judge"]["calls"] == sum(u.get("judge", {}).get("calls", 0) for u in per_worker)
    assert run.data.metrics["judge_calls"] == summary["usage"]["judge"]["calls"]
    # (Not asserted: that another worker's usage is in that sum. Whether the joining worker evaluates
    # anything depends on timing: worker 0 may take every candidate the killed worker gave up.)

    # Another machine (a folder without summary.json) exports the best prompt from the stores.
    from typer.testing import CliRunner

    from opro.cli import app

    exported = CliRunner().invoke(app, ["export", "best", "--config", str(configs[3])])
    assert exported.exit_code == 0, exported.output
    assert exported.stdout.strip() == summary["best_template"].strip()
    assert not (tmp_path / "machine3" / "out" / "summary.json").exists()


def test_workers_racing_to_create_the_schema_of_a_fresh_postgresql_store_all_open_it(postgres: str) -> None:
    """On PostgreSQL the loser of the schema race sees the winner's types (a unique violation in
    pg_type) or alembic_version row when both create at once, and its tables (DuplicateTable, a
    ProgrammingError) when it looked before the winner committed and created after: all are retried.
    4 threads open each of 12 fresh databases, starting within 0.1 s of each other."""
    import random
    import threading

    from fakes import run_together
    from sqlalchemy import create_engine, text

    admin = create_engine(f"{postgres}/opro", isolation_level="AUTOCOMMIT")
    rng, lock = random.Random(0), threading.Lock()

    def open_after_a_while(url: str) -> None:
        with lock:
            delay = rng.uniform(0.0, 0.1)
        time.sleep(delay)
        open_storage(url).engine.dispose()  # type: ignore[attr-defined]

    try:
        for i in range(12):
            db = f"race_{uuid.uuid4().hex[:8]}"
            with admin.connect() as conn:
                conn.execute(text(f"CREATE DATABASE {db}"))
            errors = run_together(lambda _, db=db: open_after_a_while(f"{postgres}/{db}"), threads=4)  # type: ignore[misc]
            assert not errors, (i, errors)
    finally:
        admin.dispose()
