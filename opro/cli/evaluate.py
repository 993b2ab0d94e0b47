"""`opro evaluate`: score one prompt on a split of the experiment's golden dataset."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors, console, no_progress_option, split_list
from opro.cli.render import show_evaluation


@_errors()
def evaluate(
    config: Path = typer.Argument(..., help="Experiment TOML file."),
    prompt: str = typer.Option("initial", help="best | initial | run:DIR | prompts:/NAME@ALIAS | FILE | text:INSTRUCTION"),
    split: str = typer.Option("heldout", help="heldout | validation | optimization | exemplar"),
    metrics: str = typer.Option("", help="Extra metrics, comma-separated: faithfulness, relevancy, token_f1."),
    out: Path | None = typer.Option(None, help="Per-question table: .csv or .json (default: both, in <output_dir>/evaluate/)."),
    max_errors: int | None = typer.Option(None, help="Stop after this many failed questions (default: no limit)."),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Record the evaluation as an MLflow run."),
    no_progress: bool = no_progress_option(),
) -> None:
    """Score one prompt on a split of the experiment's golden dataset with the correctness judge."""
    from opro.workflows.evaluate import evaluate_prompt

    out_console = console()
    done = evaluate_prompt(config, prompt=prompt, split=split, metrics=split_list(metrics), out=out,
                           max_errors=max_errors, progress=False if no_progress else None, mlflow=mlflow,
                           notice=out_console.print)
    show_evaluation(out_console, done)
