"""`opro ui`: the MLflow UI on a run's store, offline."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors


@_errors()
def ui(
    config: Path | None = typer.Argument(None, help="Experiment TOML whose MLflow store to open."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(5000, help="Port to listen on."),
) -> None:
    """Open the MLflow UI on a run's store, offline (no price-map download by litellm)."""
    from opro.workflows.ui import serve_ui

    code = serve_ui(config, tracking_uri=tracking_uri, host=host, port=port,
                    notice=lambda text: typer.echo(text, err=True))
    raise typer.Exit(code=code)
