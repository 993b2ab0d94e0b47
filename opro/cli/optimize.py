"""`opro optimize`: the OPRO search, validation and the validated winner."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from opro.cli._common import _errors
from opro.cli.render import _result_table, _usage_table
from opro.redaction import redact_url


def _before_the_search(exp: Any, console: Any) -> Any:
    """Worker 0 prints (and keeps) the plan, and the stored probe's verdict (never a new probe)."""
    from opro.plan import make_plan

    plan = make_plan(exp.config, documents=lambda: exp.documents)
    console.print("\n".join(plan.lines()), markup=False, soft_wrap=True)
    exp.run_dir.write_plan(plan.as_dict())
    if exp.run_dir.probe.is_file():
        from opro.headroom import stored_probe

        probed, why = stored_probe(exp)
        said = probed.verdict_lines() if probed is not None else [f"probe: {why}"]
        console.print("\n".join(said), markup=False, soft_wrap=True)
    return plan


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
    from rich.console import Console
    from rich.markup import escape

    from opro.errors import ConfigError
    from opro.experiment import Experiment

    try:
        index, count = (int(x) for x in worker.split("/"))
    except ValueError:
        raise ConfigError(f"--worker must look like I/N (for example 0/2), got {worker!r}") from None
    from opro.search import check_worker_spec

    check_worker_spec(index, count)
    console = Console()
    try:
        exp = Experiment.from_file(config, progress=False if no_progress else None)
        try:
            plan = _before_the_search(exp, console) if index == 0 else None
            started = time.perf_counter()
            result = exp.optimize(worker_index=index, num_workers=count, fresh=fresh)
            taken = time.perf_counter() - started
        finally:
            exp.close()
    except KeyboardInterrupt:
        Console(stderr=True).print(
            f"interrupted: everything finished so far is kept in the study; rerun `opro optimize {config}"
            + (f" --worker {worker}" if count > 1 else "") + "` to resume where it stopped",
            markup=False, soft_wrap=True,
        )
        raise typer.Exit(130) from None
    table, instructions = _result_table(result, title=f"opro optimize: {exp.config.experiment.name}")
    console.print(table)
    console.print(instructions)
    n_pruned = sum(1 for r in result.history if r.status == "pruned")
    console.print(
        f"{len(result.history)} candidates ({n_pruned} pruned), stopped by {result.stopped_reason}, "
        f"{result.wall_s:.0f}s; search scores on {len(exp.dataset.examples_in('optimization'))} optimization questions"
    )
    console.print(escape(result.headline()))
    console.print(result.judge_noise, markup=False, soft_wrap=True)  # summary.json says it too, beside the gain
    from opro.dataset import split_shortfall

    shrunk = split_shortfall(exp.dataset.split) if exp.dataset.split is not None else None
    if shrunk:
        console.print(f"[yellow]warning:[/] {escape(shrunk)}")
    console.print(_usage_table(result.usage))
    if plan is not None:
        from opro.plan import check

        console.print("\n".join(check(plan.as_dict(), result.usage, wall_s=taken)), markup=False, soft_wrap=True)
    if exp.config.optimizer.steps > 0 and index == 0 and not any(r.step > 0 for r in result.history):
        reasons = sorted({r["reason"] for r in result.rejected}) or ["the optimizer returned nothing"]
        console.print(
            f"[red]error:[/red] the optimizer proposed no usable instruction in {exp.config.optimizer.steps} step(s) "
            f"({len(result.rejected)} rejected: {escape('; '.join(reasons))}); "
            + escape("check [models.optimizer] (a stronger model) or [optimizer].max_instruction_chars"),
            soft_wrap=True,
        )
        raise typer.Exit(1)
    if index == 0:
        written = [p.name for p in exp.run_dir.optimize_outputs()]
        console.print(f"outputs: {exp.config.output_dir}  ({', '.join(written)})")
        console.print(f"MLflow run {result.mlflow_run_id} in {redact_url(exp.config.mlflow_uri)}")
        if exp.config.tracking.register_prompt:
            console.print(f"registered: prompts:/{exp.config.prompt_name}@{exp.config.tracking.prompt_alias}")
