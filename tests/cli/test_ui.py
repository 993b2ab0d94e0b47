"""`opro ui` serves the run's MLflow store over HTTP within a bound, offline."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fakes import experiment_config, write_toml


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


def test_ui_serves_the_config_store_within_a_bound(tmp_path: Path) -> None:
    from opro.config import load_config
    from opro.tracking import MlflowTracker

    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    tracker = MlflowTracker(tracking_uri=load_config(config).mlflow_uri, experiment_name="ui-probe")
    tracker.start(run_name="r", params={})
    tracker.finish()
    port = _free_port()
    # The user's environment lacks the litellm switch: opro ui must set it itself.
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from opro.cli import main; main()", "ui", str(config), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, _ = _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"no answer within 90 s (exit {proc.poll()})"
        status, body = _get(f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/search?max_results=50")
        assert status == 200 and "ui-probe" in {e["name"] for e in json.loads(body)["experiments"]}
        status, page = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and "<html" in page.lower()
    finally:
        os.killpg(proc.pid, 15)
        out = proc.communicate(timeout=30)[0]
    assert "MLflow UI on http://127.0.0.1:" in out


def test_ui_without_a_store_says_run_optimize_first(tmp_path: Path) -> None:
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    proc = subprocess.run([sys.executable, "-c", "from opro.cli import main; main()", "ui", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no MLflow store at" in proc.stderr and "opro optimize" in proc.stderr


def test_ui_on_a_port_in_use_fails_with_exit_2_instead_of_a_server_that_exits_0(tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")  # exists: the check that follows is the port's
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-c", "from opro.cli import main; main()", "ui", "--tracking-uri", f"sqlite:///{store}",
             "--port", str(port)], capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
