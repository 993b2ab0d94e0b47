"""No secret reaches any file or any printed line, through the real network path.

The loopback server refuses a request unless it carries both secrets (the key in the Authorization
header and a second one in the base URL's query, as some proxies take it), so every call that
succeeds proves opro really read and sent them; then every file the commands wrote (stores, call
cache, MLflow artifacts, reports, exports) and everything they printed is searched for either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fakes import experiment_config, write_toml
from fault_server import FaultServer

KEY = "sk-secret-header-5f1d2c3b4a"
URL_KEY = "urlsecret-9e8d7c6b5a"


def _opro(tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "OPRO_SECRET_TEST_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run(
        [sys.executable, "-c", "from opro.cli import main; main()", *args],
        cwd=tmp_path, env={**env, "COLUMNS": "300"}, capture_output=True, text=True, timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _files_holding(root: Path, secrets: tuple[str, ...], *, skip: Path) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and path != skip:
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {s}" for s in secrets if s.encode() in data]
    return hits


def test_no_secret_in_any_file_or_output_of_a_full_run(tmp_path: Path) -> None:
    secrets = (KEY, URL_KEY)
    outputs: list[str] = []
    with FaultServer(key=KEY, url_key=URL_KEY) as server:
        cfg = experiment_config(tmp_path, optimizer={"steps": 1, "candidates_per_step": 2, "minibatch_size": 2, "finalists": 1})
        for role in ("task", "judge", "optimizer", "generator"):
            cfg["models"][role] = {
                "backend": "openai", "model": f"{'optimizer' if role == 'generator' else role}-model",
                "base_url": f"{server.base_url}?api-key={URL_KEY}", "api_key_env": "OPRO_SECRET_TEST_KEY",
            }
        cfg["experiment"]["progress"] = False
        config = write_toml(cfg, tmp_path / "exp.toml")
        steps = [
            ("optimize", str(config), "--no-progress"),
            ("evaluate", str(config), "--split", "heldout", "--no-progress"),
            ("compare", str(config), "--no-progress"),
            *[("export", "best", "-c", str(config), "-f", f, "-o", str(tmp_path / "exports" / f))
              for f in ("text", "json", "llamaindex", "dspy")],
            ("export", "best", "-c", str(config), "-f", "mlflow", "--alias", "staging"),
        ]
        for args in steps:
            rc, out = _opro(tmp_path, *args)
            outputs.append(out)
            assert rc == 0, (args, out)
        # The server saw both secrets on every answered request (it refuses any request without them),
        # and the query key travelled as a query, not inside the route.
        assert server.counts["task"] > 0 and server.counts["judge"] > 0 and server.counts["optimizer"] > 0
        assert all(p.startswith("/v1/chat/completions?") and f"api-key={URL_KEY}" in p for p in server.paths)
        # Error paths print the server URL: a permanent refusal and an unreachable server.
        server.faults["task"] = "401"
        rc, out = _opro(tmp_path, "evaluate", str(config), "--prompt", "text:Reply in French.", "--no-progress")
        outputs.append(out)
        assert rc == 1 and "authentication failed (401)" in out and f"{server.base_url}?api-key=***" in out, out
    rc, out = _opro(tmp_path, "evaluate", str(config), "--prompt", "text:Reply in German.", "--no-progress")
    outputs.append(out)
    assert rc == 1 and "127.0.0.1" in out and "api-key=***" in out

    # The search itself is a control: the user's own config holds the URL secret, and it is found.
    assert _files_holding(tmp_path, secrets, skip=tmp_path / "nothing") == [f"exp.toml: {URL_KEY}"]
    assert _files_holding(tmp_path, secrets, skip=config) == []
    printed = "\n".join(outputs)
    assert KEY not in printed and URL_KEY not in printed
