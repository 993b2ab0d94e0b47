"""`opro judge`: agreement between judges, and the judge's calibration."""

from __future__ import annotations

from pathlib import Path

import typer

from opro.cli._common import _errors, console, split_list

judge_app = typer.Typer(help="Inspect LLM judges: agreement between two judges or with human labels.", no_args_is_help=True, rich_markup_mode=None)

_JUDGE_A = typer.Option(
    None, "--judge-a", help="Judge A: llamacpp:NAME, openai:MODEL[@BASE_URL]; prefix mlflow: for MLflow's built-in "
    "correctness judge on that model (yes = 5, no = 1). Default: the file's 'score' column."
)
_JUDGE_B = typer.Option(None, "--judge-b", help="Judge B model spec, e.g. mlflow:openai:MODEL@BASE_URL (or use --labels).")
_LABELS = typer.Option(
    None, "--labels", help="Labels CSV/JSON with query and score (and answer): human labels, or another "
    "judge's calibration verdicts.csv."
)
_CONDITIONS = typer.Option(
    "reference,wrong,task,number,name,first-sentence", "--conditions",
    help="Comma list of reference, wrong (another question's reference), task (the RAG answer) and the "
         "near misses made from the reference without a model: number (one number changed), name (one name "
         "swapped for another reference's), first-sentence (cut to its first sentence). A near miss is "
         "judged only where it applies: up to 3 more judge calls per question, each reusing its question's "
         "prompt prefix on the embedded judge.",
)
_RETEST = typer.Option(
    5, "--retest", help="Answers per condition (reference, wrong, task) judged a second time without the cache."
)
_JUDGE = typer.Option(
    None, "--judge", help="Judge model instead of [models.judge]: llamacpp:NAME or openai:MODEL[@BASE_URL]."
)


@judge_app.command("agreement")
@_errors()
def judge_agreement(
    answers: str = typer.Option(..., "--answers", help="Evaluation CSV/JSON with query, answer, reference (and score)."),
    judge_a: str | None = _JUDGE_A,
    judge_b: str | None = _JUDGE_B,
    labels: str | None = _LABELS,
    template: str = typer.Option("llamaindex", "--template", help="Judge template: llamaindex, prometheus, fewshot or a file."),
    template_b: str | None = typer.Option(None, "--template-b", help="Template for judge B (default: --template)."),
    score_from_a: str = typer.Option("reply", "--score-from-a", help="Judge A's score: reply, logits (llamacpp) or auto."),
    score_from_b: str = typer.Option("reply", "--score-from-b", help="Judge B's score: reply, logits (llamacpp) or auto."),
    cache: str | None = typer.Option(None, "--cache", help="LLM call cache file (default: the opro cache dir)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the call cache."),
) -> None:
    """Compare two judges (or a judge and human labels) on the same answers."""
    from opro.calibration.agreement import judge_agreement as measure

    if (judge_b is None) == (labels is None):
        typer.echo("error: give exactly one of --judge-b SPEC or --labels FILE", err=True)
        raise typer.Exit(code=2)
    done = measure(answers, judge_a=judge_a, judge_b=judge_b, labels=labels, template=template, template_b=template_b,
                   score_from_a=score_from_a, score_from_b=score_from_b, cache=cache, use_cache=not no_cache)
    out = console()
    for table in done.rich_tables():
        out.print(table)


@judge_app.command("calibrate")
@_errors()
def judge_calibrate(
    config: Path = typer.Argument(..., help="Experiment TOML: its [data].dataset, models, retrieval and [judge] are used."),
    n: int = typer.Option(40, "--n", help="Questions sampled from the dataset (seeded)."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed (default: [experiment].seed)."),
    conditions: str = _CONDITIONS,
    retest: int = _RETEST,
    judge: str | None = _JUDGE,
    template: str | None = typer.Option(None, "--template", help="Judge template instead of [judge].template."),
    score_from: str | None = typer.Option(None, "--score-from", help="reply, logits or auto instead of [judge].score_from."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Judge reply length instead of [judge].max_tokens."),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log the calibration as an MLflow run."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Measure how well the judge tells right answers from wrong ones and from near misses, and its noise.

    Per condition: the AUC against the reference, the share of questions where the reference scored
    higher (ties half) and the mean drop. Writes <output_dir>/judge_calibration.json (shown beside
    gains by optimize and compare), a CSV of every verdict and a plot under <output_dir>/judge_calibration/.
    """
    from opro.workflows.calibrate import calibrate_judge

    done = calibrate_judge(config, n=n, seed=seed, conditions=[c.strip() for c in split_list(conditions)],
                           retest=retest, judge=judge, template=template, score_from=score_from,
                           max_tokens=max_tokens, mlflow=mlflow, progress=progress)
    out = console()
    for line in (done.report.rich_table(), done.report.contrast_table(), *done.report.lines()):
        out.print(line)
    for path in done.paths.values():
        typer.echo(f"wrote {path}")
    for where in done.recorded:
        typer.echo(f"recorded: {where.where}")
