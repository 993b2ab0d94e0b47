"""`opro plan` and `opro probe`: what a run will cost and detect, and where the headroom is, before it."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors, console, say


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

    from opro.workflows.plan import plan_experiment

    done = plan_experiment(config, probe=probe, questions=questions)
    if as_json:
        probed = {"probe": done.probe.to_dict()} if done.probe is not None else {}
        typer.echo(json.dumps({**done.plan.as_dict(), **probed}, indent=2))
        return
    out = console()
    say(out, "\n".join(done.plan.lines()))
    if done.probe is not None:
        say(out, "\n".join(done.probe.verdict_lines()))
        where = done.probe_files[0]
        say(out, f"(read from {where}: made with these settings)" if done.reused
            else f"wrote {where} and {done.probe_files[1]}")


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
    from opro.workflows.plan import probe_experiment

    done = probe_experiment(config, questions=questions, mlflow=mlflow, progress=progress)
    out = console()
    say(out, "\n".join(done.result.lines()))
    for path in done.paths.values():
        say(out, f"wrote {path}")
    for where in done.recorded:
        say(out, f"recorded: {where.where}")
