"""Export a prompt given by its spec (``opro export``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from opro.errors import ConfigError
from opro.search.records import Recorder, record_all

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
    mlflow: bool = True,
    recorders: Sequence[Recorder] | None = None,
) -> ExportResult:
    """Resolve ``spec`` (best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:...) under the
    experiment ``config`` (when given) and export it as ``format``; a format that writes files and no
    ``out`` writes under ``<output_dir>/export/``. An export that wrote files or a registry version is
    recorded (:func:`opro.export.export_record`) through ``recorders``, by default the config's (MLflow
    in ``tracking_uri`` or the config's store, unless ``mlflow`` is off; without a config, none): an
    export printed to stdout leaves nothing to point at and is not recorded."""
    from opro.config import check_mlflow_uri, load_config
    from opro.export import EXPORT_FORMATS, FILE_ONLY_FORMATS, STDOUT_FORMATS, export_prompt, export_record
    from opro.export.sources import resolve_prompt
    from opro.tracking.factory import command_recorders

    if format not in EXPORT_FORMATS:
        raise ConfigError(f"--format {format!r} is not one of {', '.join(EXPORT_FORMATS)}")
    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    cfg = load_config(config) if config is not None else None
    if recorders is None:
        recorders = command_recorders(cfg, mlflow=mlflow, tracking_uri=tracking_uri) if cfg is not None else []
    # Whether this export writes something a record can point at (a file or a registry version).
    durable = out is not None or format not in STDOUT_FORMATS
    store = tracking_uri or (cfg.mlflow_uri if cfg is not None else None)
    where = "--tracking-uri" if tracking_uri else "[tracking].mlflow_uri"
    if store and (format == "mlflow" or spec.startswith("prompts:/") or (durable and recorders)):
        from opro.tracking import check_server

        check_server(store, where=where)
    if store and (format == "mlflow" or (durable and recorders)):  # before any file: a store that cannot record
        from opro.tracking import check_writable

        check_writable(store, where=where, off="--no-mlflow" if format != "mlflow" else "another --format")
    resolved = resolve_prompt(spec, config=cfg, tracking_uri=tracking_uri)
    target = out
    if target is None and format in FILE_ONLY_FORMATS:
        if cfg is None:
            raise ConfigError(f"--format {format} writes files: give --out PATH or --config CONFIG.toml")
        from opro.paths import RunDir

        target = RunDir(cfg.output_dir).export
    result = export_prompt(
        resolved, format=format, out=target, config=cfg,  # type: ignore[arg-type]
        name=name, alias=alias, tracking_uri=tracking_uri, snippet=snippet,
    )
    if not (result.paths or result.uri):
        return result
    return replace(result, recorded=record_all(recorders, export_record(resolved, result)))
