"""`opro ui`: the MLflow UI on a run's store, offline."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors
from opro.redaction import redact_url


@_errors()
def ui(
    config: Path | None = typer.Argument(None, help="Experiment TOML whose MLflow store to open."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(5000, help="Port to listen on."),
) -> None:
    """Open the MLflow UI on a run's store, offline (no price-map download by litellm)."""
    import os
    import subprocess
    import sys

    from opro.errors import ConfigError

    if tracking_uri is None:
        if config is None:
            raise ConfigError("give the experiment's config (opro ui CONFIG.toml) or --tracking-uri URI")
        from opro.config import load_config

        tracking_uri = load_config(config).mlflow_uri
    from opro.config import check_mlflow_uri

    check_mlflow_uri(tracking_uri, where="--tracking-uri")
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(
            f"no MLflow store at {tracking_uri.removeprefix('sqlite:///')}: run `opro optimize` first"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    import socket

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
    typer.echo(f"MLflow UI on http://{host}:{port} (store {redact_url(tracking_uri)}); Ctrl-C stops it", err=True)
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
            "--host", host, "--port", str(port), "--workers", "1"]
    try:
        code = subprocess.call(argv, env=env)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code=code)

