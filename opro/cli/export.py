"""`opro export`: a prompt as text, JSON, LlamaIndex, DSPy or an MLflow registry version."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors

# The export formats' table: `opro export`'s --format choices and help are read from it.
from opro.export import EXPORT_FORMATS, FILE_ONLY_FORMATS, REGISTRY_FORMATS, SNIPPET_FORMATS, STDOUT_FORMATS

_OUT = typer.Option(
    None, "--out", "-o",
    help=f"File or directory [{'/'.join(STDOUT_FORMATS)}: stdout; {'/'.join(FILE_ONLY_FORMATS)}: OUTPUT_DIR/export/]",
)


@_errors(code=2)
def export(
    spec: str = typer.Argument(
        "best", help="The prompt: best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:INSTRUCTION."
    ),
    config: Path | None = typer.Option(None, "--config", "-c", help="Experiment TOML (for best, initial, defaults)."),
    format: str = typer.Option("text", "--format", "-f", help=" | ".join(EXPORT_FORMATS)),
    out: Path | None = _OUT,
    alias: str | None = typer.Option(
        None, "--alias", help=f"{'/'.join(REGISTRY_FORMATS)}: alias to point at the new version, e.g. production"
    ),
    name: str | None = typer.Option(
        None, "--name", help=f"{'/'.join(REGISTRY_FORMATS)}: registered prompt name [default: the config's]"
    ),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    snippet: bool = typer.Option(
        True, "--snippet/--no-snippet", help=f"{'/'.join(SNIPPET_FORMATS)}: also write a .py snippet"
    ),
    mlflow: bool = typer.Option(
        True, "--mlflow/--no-mlflow", help="With --config: record an export to files or a registry as an MLflow run."
    ),
) -> None:
    """Export a prompt as text, JSON, a LlamaIndex PromptTemplate, a DSPy signature or an MLflow registry version."""
    from opro.workflows.export import export_spec

    result = export_spec(spec, config=config, format=format, out=out, alias=alias, name=name,
                         tracking_uri=tracking_uri, snippet=snippet, mlflow=mlflow)
    if result.content is not None:
        # Exactly the content (no added newline): `> prompt.txt` must round-trip byte for byte.
        typer.echo(result.content, nl=False)
    for path in result.paths:
        typer.echo(f"wrote {path}", err=True)
    for recorded in result.recorded:
        typer.echo(f"recorded: {recorded.where}", err=True)
    if result.uri:
        typer.echo(f"registered {result.uri}" + (f" (alias {result.alias}: prompts:/{result.uri.split('/')[1]}@{result.alias})" if result.alias else ""))

