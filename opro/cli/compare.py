"""`opro compare`: compare prompts on a split, with paired tests, and promote the best one."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors, console, no_progress_option, split_list
from opro.cli.render import show_comparison

_COMPARE_PROMPTS = typer.Option(
    None, "--prompt", "-p",
    help="Prompt to compare (repeatable): best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:INSTRUCTION. "
    "[default: best]",
)
_SET = typer.Option(
    None, "--set",
    help="NAME=VALUE (repeatable): answer every --prompt with this setting (a search dimension a prompt carries), "
    "e.g. --prompt initial --set top_k=1; a prompt may also name its own: \"initial {top_k=1}\".",
)
_MARGIN = typer.Option(
    None, "--margin",
    help="Non-inferiority margin in judge points (e.g. 0.25): also test that each prompt is not worse than the "
    "baseline by more than it (the one-sided betting test on the paired differences, on source-passage cluster "
    "means where questions share one; Holm over the prompts), beside its paired cost difference. "
    "With --promote, promotion then needs that test passed and a lower cost per answer, not a gain.",
)
_PROMOTE = typer.Option(
    None, "--promote",
    help="Move this Prompt Registry alias to the best prompt, only if it beats the baseline on held-out "
    "questions by the paired betting test (Holm-adjusted over the prompts); otherwise refuse (exit 1) with the figures.",
)
_MIN_COVERAGE = typer.Option(
    0.9, "--min-coverage", min=0.01, max=1.0,
    help="With --promote: the share of held-out questions both prompts must have valid scores on.",
)

@_errors(code=2)
def compare(
    config: Path = typer.Argument(..., help="Experiment TOML: its models, retrieval, judge and dataset split are used."),
    prompt: list[str] = _COMPARE_PROMPTS,
    settings: list[str] = _SET,
    baseline: str = typer.Option("initial", "--baseline", help="The prompt the others are tested against (added if not given)."),
    split: str = typer.Option("heldout", "--split", help="heldout | validation | optimization | exemplar"),
    metrics: str = typer.Option("", "--metrics", help="Extra metrics, comma-separated: faithfulness,relevancy,token_f1"),
    out: Path | None = typer.Option(None, "--out", help="Report directory [default: OUTPUT_DIR/compare/NAME]"),
    name: str | None = typer.Option(None, "--name", help="Name of the comparison [default: a timestamp]"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log the comparison as an MLflow run."),
    resamples: int = typer.Option(10_000, "--resamples", min=1000, help="Not used by the tests or intervals (the betting "
                                   "test draws no resamples): kept so older commands run, and recorded in the report."),
    seed: int = typer.Option(0, "--seed", help="Recorded in the report; the tests and intervals do not use it."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level of the tests."),
    margin: float | None = _MARGIN,
    promote_alias: str | None = _PROMOTE,
    min_coverage: float = _MIN_COVERAGE,
    no_progress: bool = no_progress_option(),
) -> None:
    """Compare prompts on the held-out split: mean with 95% CI, pass rate, win/tie/loss, paired tests."""
    from opro.heldout.compare import ComparisonSettings
    from opro.program.configurations import parse_settings
    from opro.workflows.compare import compare_and_save

    out_console = console()
    asked = ComparisonSettings(
        prompts=tuple(prompt or ["best"]), settings=parse_settings(settings or []), baseline=baseline, split=split,
        metrics=tuple(split_list(metrics)), out=out, name=name, tracking_uri=tracking_uri, mlflow=mlflow,
        resamples=resamples, seed=seed, alpha=alpha, margin=margin, promote_alias=promote_alias,
        min_coverage=min_coverage,
    )
    done = compare_and_save(
        config, asked, progress=False if no_progress else None,
        notice=lambda text: out_console.print(text, markup=False, soft_wrap=True),
    )
    show_comparison(out_console, done)
    if done.decision is not None and not done.decision.granted:
        raise typer.Exit(1)
