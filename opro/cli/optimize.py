"""`opro optimize`: the OPRO search, validation and the validated winner."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from opro.cli._common import Terminated, _errors, console, interrupted_exit, interruptible, say
from opro.cli.render import show_no_proposal, show_optimization, show_outputs


@_errors()
def optimize(
    config: Path = typer.Argument(..., help="Experiment TOML file (see experiments/)."),
    worker: str = typer.Option("0/1", help="I/N: this is worker I of N sharing one Optuna study (RDB storage)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="Hide progress bars."),
    fresh: bool = typer.Option(
        False, "--fresh", help="Archive the existing study (kept as <name>-archived-<time>) and start a new one."
    ),
) -> None:
    """Run the OPRO loop: search on the optimization split, validate the finalists, return a validated winner."""
    from opro.workflows.optimize import optimize as run_optimize  # opro.optimize
    from opro.workflows.optimize import parse_worker

    index, count = parse_worker(worker)
    out = console()
    try:
        with interruptible():  # SIGTERM (kill, a scheduler) ends it as Ctrl-C does
            done = run_optimize(config, worker_index=index, num_workers=count, progress=False if no_progress else None,
                                fresh=fresh, notice=lambda text: say(out, text))
    except KeyboardInterrupt as exc:
        by = f" by {signal.Signals(exc.signum).name}" if isinstance(exc, Terminated) else ""
        say(console(stderr=True),
            f"interrupted{by}: everything finished so far is kept in the study; rerun `opro optimize {config}"
            + (f" --worker {worker}" if int(worker.split("/")[1]) > 1 else "") + "` to resume where it stopped")
        raise typer.Exit(interrupted_exit(exc)) from None
    show_optimization(out, done)
    if done.proposed_nothing:
        show_no_proposal(out, done)
        raise typer.Exit(1)
    if done.worker_index == 0:
        show_outputs(out, done)
