"""`opro plan` and `opro probe`: what a run will cost and detect, and where the headroom is, before it."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors


@_errors()
def plan(
    config: Path = typer.Argument(..., help="Experiment TOML file (see experiments/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    probe: bool = typer.Option(
        False, "--probe", help="Also probe where the headroom is (`opro probe`; the stored probe.json when it was "
        "made with these settings) and print its verdict with the plan."),
    questions: int | None = typer.Option(None, "--questions", min=1, help="With --probe: pilot questions."),
) -> None:
    """Before a run: the smallest gain it can detect, its calls, tokens, time and cost per role (no LLM
    call; with --probe, the probe's calls)."""
    import json

    from opro.experiment import Experiment
    from opro.plan import make_plan

    exp = Experiment.from_file(config, progress=None if probe else False)
    try:
        probed = None
        if probe:
            from opro.headroom import probe_or_stored

            probed, reused = probe_or_stored(exp, questions=questions)
        made = make_plan(exp.config, documents=lambda: exp.documents)  # after the probe: planned by its noise
    finally:
        exp.close()
    if as_json:
        typer.echo(json.dumps({**made.as_dict(), **({"probe": probed.to_dict()} if probed else {})}, indent=2))
        return
    typer.echo("\n".join(made.lines()))
    if probed is not None:
        where = exp.run_dir.probe
        typer.echo("\n".join(probed.verdict_lines()))
        typer.echo(f"(read from {where}: made with these settings)" if reused else f"wrote {where} and "
                   f"{exp.run_dir.probe_report}")


@_errors()
def probe_command(
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
    from opro.experiment import Experiment
    from opro.headroom import run_probe
    from opro.tracking.commands import command_recorders

    exp = Experiment.from_file(config, progress=progress)
    try:
        done = run_probe(exp, recorders=command_recorders(exp.config, mlflow=mlflow), questions=questions)
    finally:
        exp.close()
    typer.echo("\n".join(done.result.lines()))
    for path in done.paths.values():
        typer.echo(f"wrote {path}")
    for where in done.recorded:
        typer.echo(where.where)
