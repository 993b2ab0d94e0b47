"""`opro plan`: what a run will cost and detect before it (with --probe, where the headroom is)."""

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
