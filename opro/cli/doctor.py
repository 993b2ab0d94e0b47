"""`opro doctor`: what the embedded engine finds on this machine, and whether its models can run here."""

from __future__ import annotations

import typer


def doctor(
    probe: bool = typer.Option(True, "--probe/--no-probe", help="probe each assembled embedded model in a child process"),
    refresh: bool = typer.Option(False, "--refresh", help="probe again even where an earlier probe's result is recorded"),
) -> None:
    """What the embedded engine finds here: CPU features, threads and why, llama.cpp build, buffer
    types, start-up probe, model packs. Exits 1 if an embedded model cannot run on this machine."""
    from opro.llm.doctor import diagnose, render

    found = diagnose(probe=probe, refresh=refresh)
    typer.echo(render(found))
    if not found.ok:
        raise typer.Exit(1)

