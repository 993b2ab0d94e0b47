"""`opro ui` serves the run's MLflow store over HTTP within a bound, offline."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
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


def _session(sid: int) -> list[str]:
    """The live processes of session ``sid`` (the test starts `opro ui` as a session of its own), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{stat.parent.name}: {cmd}")
    return found


@pytest.mark.parametrize("how", ["SIGTERM to opro", "SIGHUP to opro", "Ctrl-C (SIGINT to the group)"])
def test_ui_stops_its_server_on_every_stop_signal_and_leaves_nothing_running(tmp_path: Path, how: str) -> None:
    """A service manager sends SIGTERM to opro alone, a closed ssh session SIGHUP, a terminal's Ctrl-C
    SIGINT to the whole foreground group: each time the server goes with opro, its port is free, and
    Ctrl-C prints one line (no CancelledError traceback)."""
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from opro.cli import main; main()", "ui", "--tracking-uri", f"sqlite:///{store}",
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        # opro as a user starts it: SIGINT at its default, whatever the test runner's parent ignores
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stdout or ()))
    reader.start()
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and proc.poll() is None and status != 200:
            try:
                status, _ = _get(f"http://127.0.0.1:{port}/health")
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"no answer within 120 s (exit {proc.poll()})"
        while time.monotonic() < deadline and not any("/health" in line for _, line in lines):
            time.sleep(0.1)  # the server logs the request after answering it: that line is not the stop's
        sent = time.monotonic()
        if how.startswith("Ctrl-C"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGHUP)
        assert proc.wait(timeout=60) == 0
        reader.join(timeout=10)
        deadline = time.monotonic() + 5  # what is left would be serving: give the kernel a moment
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(proc.pid) == [], "processes left behind"
        with socket.create_server(("127.0.0.1", port)):
            pass  # the port is free
        after = [line for at, line in lines if at > sent]
        assert len(after) == 1 and f"stopped the MLflow UI on http://127.0.0.1:{port}" in after[0], after
        assert "Traceback" not in "".join(line for _, line in lines)
    finally:
        for pid in [int(entry.partition(":")[0]) for entry in _session(proc.pid)]:
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
