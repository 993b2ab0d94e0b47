"""`opro evaluate` and `opro compare`: score one prompt, or compare prompts, on a split."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors, _listing
from opro.redaction import redact_url


@_errors()
def evaluate(
    config: Path = typer.Argument(..., help="Experiment TOML file."),
    prompt: str = typer.Option("initial", help="best | initial | run:DIR | prompts:/NAME@ALIAS | FILE | text:INSTRUCTION"),
    split: str = typer.Option("heldout", help="heldout | validation | optimization | exemplar"),
    metrics: str = typer.Option("", help="Extra metrics, comma-separated: faithfulness, relevancy, token_f1."),
    out: Path | None = typer.Option(None, help="Per-question table: .csv or .json (default: both, in <output_dir>/evaluate/)."),
    max_errors: int | None = typer.Option(None, help="Stop after this many failed questions (default: no limit)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="Hide progress bars."),
) -> None:
    """Score one prompt on a split of the experiment's golden dataset with the correctness judge."""
    from rich.console import Console
    from rich.markup import escape

    from opro.dataset import SPLIT_NAMES
    from opro.errors import ConfigError
    from opro.evaluation import evaluate_examples
    from opro.experiment import Experiment
    from opro.guard import check_heldout
    from opro.judges import make_extra_metrics
    from opro.sources import resolve_prompt

    if split not in SPLIT_NAMES:
        raise ConfigError(f"--split {split!r}: use one of {', '.join(SPLIT_NAMES)}")
    console = Console()
    exp = Experiment.from_file(config, progress=False if no_progress else None)
    try:
        resolved = resolve_prompt(prompt, config=exp.config)
        if split == "heldout":
            console.print(check_heldout(exp.dataset, output_dir=exp.config.output_dir, embed=exp.paraphrase_embed()))
        report = evaluate_examples(
            program=exp.program,
            template=resolved.template,
            examples=exp.dataset.examples_in(split),  # type: ignore[arg-type]
            judge=exp.judge,
            extra_metrics=make_extra_metrics([m for m in metrics.split(",") if m.strip()],
                                             judge_client=lambda: exp.client("judge")),
            max_errors=max_errors,
            progress=exp.progress,
        )
        genai = None
        if exp.config.tracking.genai:
            from opro.tracking.genai import PromptEvaluation, genai_logger

            genai = genai_logger(exp).log_evaluations(
                [PromptEvaluation(label=resolved.label, template=resolved.template, report=report,
                                  tags={"opro.spec": resolved.spec})],
                dataset=exp.dataset, split=split, source="evaluate", run_name_prefix="evaluate: ",
            )
    finally:
        exp.close()
    console.print(f"[bold]{escape(resolved.label)}[/] on the {split} split ({report.n} questions)")
    console.print(escape(report.summary()))
    if out is not None:
        written = [report.to_json(out) if out.suffix == ".json" else report.to_csv(out)]
    else:
        stem = exp.run_dir.evaluate / f"{split}-{resolved.kind}"
        written = [report.to_csv(stem.with_suffix(".csv")), report.to_json(stem.with_suffix(".json"))]
    console.print("per-question table: " + ", ".join(str(w) for w in written))
    if genai is not None:
        console.print(f"MLflow evaluation run {genai.run_ids[0]} ({len(genai.runs[0].trace_ids)} traces) in "
                      f"{redact_url(exp.config.mlflow_uri)}")



@_errors(code=2)
def compare(
    config: Path = typer.Argument(..., help="Experiment TOML: its models, retrieval, judge and dataset split are used."),
    prompt: list[str] = typer.Option(
        None, "--prompt", "-p",
        help="Prompt to compare (repeatable): best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:INSTRUCTION. "
        "[default: best]",
    ),
    baseline: str = typer.Option("initial", "--baseline", help="The prompt the others are tested against (added if not given)."),
    split: str = typer.Option("heldout", "--split", help="heldout | validation | optimization | exemplar"),
    metrics: str = typer.Option("", "--metrics", help="Extra metrics, comma-separated: faithfulness,relevancy,token_f1"),
    out: Path | None = typer.Option(None, "--out", help="Report directory [default: OUTPUT_DIR/compare/NAME]"),
    name: str | None = typer.Option(None, "--name", help="Name of the comparison [default: a timestamp]"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log the comparison as an MLflow run."),
    resamples: int = typer.Option(10_000, "--resamples", min=1000, help="Random sign flips of the permutation test above 16 pairs."),
    seed: int = typer.Option(0, "--seed", help="Seed of the resampling."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level of the tests."),
    margin: float | None = typer.Option(
        None, "--margin",
        help="Non-inferiority margin in judge points (e.g. 0.25): also test that each prompt is not worse than the "
        "baseline by more than it (one-sided paired permutation test, Holm), beside its paired cost difference. "
        "With --promote, promotion then needs that test passed and a lower cost per answer, not a gain.",
    ),
    promote_alias: str | None = typer.Option(
        None, "--promote",
        help="Move this Prompt Registry alias to the best prompt, only if it beats the baseline on held-out "
        "questions by the paired permutation test (Holm-adjusted); otherwise refuse (exit 1) with the figures.",
    ),
    min_coverage: float = typer.Option(
        0.9, "--min-coverage", min=0.01, max=1.0,
        help="With --promote: the share of held-out questions both prompts must have valid scores on.",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="Hide progress bars."),
) -> None:
    """Compare prompts on the held-out split: mean with 95% CI, pass rate, win/tie/loss, paired tests."""
    from rich.console import Console

    from opro.compare import compare_prompts, save_comparison
    from opro.config import check_mlflow_uri
    from opro.experiment import Experiment
    from opro.promotion import promote

    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    specs = list(prompt or ["best"])
    decision = None
    if baseline not in specs:
        specs.insert(0, baseline)
    console = Console()
    exp = Experiment.from_file(config, progress=False if no_progress else None)
    if split == "heldout":
        from opro.plan import make_plan

        console.print("\n".join(make_plan(exp.config).compare_lines()), markup=False, soft_wrap=True)
    if mlflow or promote_alias:
        from opro.tracking import check_server

        check_server(tracking_uri or exp.config.mlflow_uri,
                     where="--tracking-uri" if tracking_uri else "[tracking].mlflow_uri")
    try:
        report = compare_prompts(
            experiment=exp,
            prompts=specs,
            baseline=baseline,
            split=split,
            extra_metrics=[m for m in metrics.split(",") if m.strip()],
            tracking_uri=tracking_uri,
            alpha=alpha,
            n_resamples=resamples,
            seed=seed,
            margin=margin,
        )
        saved = save_comparison(report, experiment=exp, directory=out, name=name, mlflow=mlflow, tracking_uri=tracking_uri)
        if promote_alias is not None:
            decision = promote(report, experiment=exp, alias=promote_alias, tracking_uri=tracking_uri,
                               min_coverage=min_coverage)
    finally:
        exp.close()
    for table in report.rich_tables():
        console.print(table)
    console.print(_listing(report.numbered_prompts()))
    console.print(report.multiplicity())
    for sentence in report.sentences():
        console.print(f"- {sentence}")
    if report.judge_noise:
        console.print(f"- {report.judge_noise}", markup=False, soft_wrap=True)
    console.print(f"reports: {saved.directory}  (report.md, report.json, scores.csv, comparison.png)")
    for recorded in saved.recorded:
        console.print(f"comparison recorded: {recorded.where}", markup=False, soft_wrap=True)
    if saved.evaluation_run_ids:
        console.print(f"MLflow evaluation runs (one per prompt, per-question traces): {', '.join(saved.evaluation_run_ids)}")
    if decision is not None:
        console.print(decision.message(), markup=False, soft_wrap=True)
        if not decision.granted:
            raise typer.Exit(1)
