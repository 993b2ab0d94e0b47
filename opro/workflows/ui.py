"""The MLflow UI on an experiment's store, offline (``opro ui``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from opro.errors import ConfigError
from opro.redaction import redact_url


def ui_store(config: str | Path | None = None, *, tracking_uri: str | None = None) -> str:
    """The store to browse: ``tracking_uri``, or else the config's; checked, and a SQLite store must exist."""
    from opro.config import check_mlflow_uri, load_config

    if tracking_uri is None:
        if config is None:
            raise ConfigError("give the experiment's config (opro ui CONFIG.toml) or --tracking-uri URI")
        tracking_uri = load_config(config).mlflow_uri
    check_mlflow_uri(tracking_uri, where="--tracking-uri")
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(
            f"no MLflow store at {tracking_uri.removeprefix('sqlite:///')}: run `opro optimize` first"
        )
    return tracking_uri


def serve_ui(
    config: str | Path | None = None,
    *,
    tracking_uri: str | None = None,
    host: str = "127.0.0.1",
    port: int = 5000,
    notice: Callable[[str], None] = lambda _: None,
) -> int:
    """Run ``mlflow server`` on the store (:func:`ui_store`) at ``host:port`` until it stops or Ctrl-C;
    ``notice`` hears where it listens. Returns the server's exit code (0 after Ctrl-C)."""
    import os
    import socket
    import subprocess
    import sys

    store = ui_store(config, tracking_uri=tracking_uri)
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    try:  # the server would log the failure and still exit 0
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another --port or --host") from None
    # MLflow's server imports litellm (installed with dspy), which otherwise downloads its model
    # price map at import and hangs for good on an offline machine. Its job runner (a dozen worker
    # processes, ~3 GB, for server-side GenAI jobs) is not needed to browse runs: off unless asked.
    from opro.tracking import offline_environment

    env = offline_environment({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ,
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    notice(f"MLflow UI on http://{host}:{port} (store {redact_url(store)}); Ctrl-C stops it")
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
            "--host", host, "--port", str(port), "--workers", "1"]
    try:
        return subprocess.call(argv, env=env)
    except KeyboardInterrupt:
        return 0
