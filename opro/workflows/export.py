"""Export a prompt given by its spec (``opro export``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from opro.errors import ConfigError

if TYPE_CHECKING:
    from opro.export import ExportResult


def export_spec(
    spec: str = "best",
    *,
    config: str | Path | None = None,
    format: str = "text",
    out: Path | None = None,
    alias: str | None = None,
    name: str | None = None,
    tracking_uri: str | None = None,
    snippet: bool = True,
) -> ExportResult:
    """Resolve ``spec`` (best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:...) under the
    experiment ``config`` (when given) and export it as ``format``; a format that writes files and no
    ``out`` writes under ``<output_dir>/export/``."""
    from opro.config import check_mlflow_uri, load_config
    from opro.export import EXPORT_FORMATS, FILE_ONLY_FORMATS, export_prompt
    from opro.sources import resolve_prompt

    if format not in EXPORT_FORMATS:
        raise ConfigError(f"--format {format!r} is not one of {', '.join(EXPORT_FORMATS)}")
    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    cfg = load_config(config) if config is not None else None
    store = tracking_uri or (cfg.mlflow_uri if cfg is not None else None)
    if store and (format == "mlflow" or spec.startswith("prompts:/")):
        from opro.tracking import check_server

        check_server(store, where="--tracking-uri" if tracking_uri else "[tracking].mlflow_uri")
    resolved = resolve_prompt(spec, config=cfg, tracking_uri=tracking_uri)
    target = out
    if target is None and format in FILE_ONLY_FORMATS:
        if cfg is None:
            raise ConfigError(f"--format {format} writes files: give --out PATH or --config CONFIG.toml")
        from opro.rundir import RunDir

        target = RunDir(cfg.output_dir).export
    return export_prompt(
        resolved, format=format, out=target, config=cfg,  # type: ignore[arg-type]
        name=name, alias=alias, tracking_uri=tracking_uri, snippet=snippet,
    )
