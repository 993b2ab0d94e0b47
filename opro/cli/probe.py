"""`opro probe`: before a search, where the headroom is, what limits the task, the judge and the optimizer."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors, console, say


@_errors()
def probe(
    config: Path = typer.Argument(..., help="Experiment TOML file (see experiments/)."),
    questions: int | None = typer.Option(
        None, "--questions", min=1,
        help="Pilot questions [default: as many as keep the probe within a fifth of the search's calls]."),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log the probe as an MLflow run (opro.kind = probe)."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Before a search: which dimensions move the score on a pilot (optimization and unreserved unused
    questions, never validation or held-out), what limits the task, the judge and the optimizer, and a verdict.

    Writes <output_dir>/probe.json (read by `opro plan --probe` and `opro optimize`) and probe.md.
    """
    from opro.workflows.plan import probe_experiment

    done = probe_experiment(config, questions=questions, mlflow=mlflow, progress=progress)
    out = console()
    say(out, "\n".join(done.result.lines()))
    for path in done.paths.values():
        say(out, f"wrote {path}")
    for where in done.recorded:
        say(out, f"recorded: {where.where}")
