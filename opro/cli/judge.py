"""`opro judge`: agreement between judges, and the judge's calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from opro.cli._common import _errors

judge_app = typer.Typer(help="Inspect LLM judges: agreement between two judges or with human labels.", no_args_is_help=True, rich_markup_mode=None)


@judge_app.command("agreement")
@_errors()
def judge_agreement(
    answers: str = typer.Option(..., "--answers", help="Evaluation CSV/JSON with query, answer, reference (and score)."),
    judge_a: str | None = typer.Option(
        None, "--judge-a", help="Judge A: llamacpp:NAME, openai:MODEL[@BASE_URL]; prefix mlflow: for MLflow's built-in "
        "correctness judge on that model (yes = 5, no = 1). Default: the file's 'score' column."
    ),
    judge_b: str | None = typer.Option(
        None, "--judge-b", help="Judge B model spec, e.g. mlflow:openai:MODEL@BASE_URL (or use --labels)."
    ),
    labels: str | None = typer.Option(
        None, "--labels", help="Labels CSV/JSON with query and score (and answer): human labels, or another "
        "judge's calibration verdicts.csv."
    ),
    template: str = typer.Option("llamaindex", "--template", help="Judge template: llamaindex, prometheus, fewshot or a file."),
    template_b: str | None = typer.Option(None, "--template-b", help="Template for judge B (default: --template)."),
    score_from_a: str = typer.Option("reply", "--score-from-a", help="Judge A's score: reply, logits (llamacpp) or auto."),
    score_from_b: str = typer.Option("reply", "--score-from-b", help="Judge B's score: reply, logits (llamacpp) or auto."),
    cache: str | None = typer.Option(None, "--cache", help="LLM call cache file (default: the opro cache dir)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the call cache."),
) -> None:
    """Compare two judges (or a judge and human labels) on the same answers."""
    from rich.console import Console

    from opro.agreement import agreement, judge_scores, load_answers, match_labels, parse_model_spec
    from opro.config import JudgeSection
    from opro.errors import ConfigError, OproError
    from opro.judges import SCORE_SOURCES, build_judge
    from opro.llm.factory import ClientFactory, open_cache

    if (judge_b is None) == (labels is None):
        typer.echo("error: give exactly one of --judge-b SPEC or --labels FILE", err=True)
        raise typer.Exit(code=2)
    rows = load_answers(answers)
    with ClientFactory(cache=open_cache(cache, enabled=not no_cache)) as models:

        def scores_of(spec: str, tmpl: str, score_from: str) -> list[float | None]:
            if score_from not in SCORE_SOURCES:
                raise ConfigError(f"--score-from-a/-b must be reply, logits or auto, got {score_from!r}")
            mlflow_judge = spec.startswith("mlflow:")
            try:
                model = parse_model_spec(spec.removeprefix("mlflow:"))
            except ConfigError as exc:  # name the spec as it was given
                raise ConfigError(f"{exc} (after mlflow:)" if mlflow_judge else str(exc)) from None
            client = models.client(model, role="judge")
            if mlflow_judge:
                from opro.tracking import genai

                return judge_scores(genai.mlflow_correctness_judge(client), rows)
            # The [judge] defaults apart from the two options; the template path is read as given (cwd).
            section = JudgeSection(template=tmpl, score_from=score_from)  # type: ignore[arg-type]
            judge = build_judge(section=section, client=client)
            return judge_scores(judge, rows)

        if judge_a is None:
            if all(r["score"] is None for r in rows):
                raise OproError(f"{answers} has no 'score' column to use as judge A; pass --judge-a SPEC")
            scores_a, name_a = [r["score"] for r in rows], "file scores"
        else:
            scores_a, name_a = scores_of(judge_a, template, score_from_a), judge_a
        if labels is not None:
            scores_b = match_labels(rows, labels)
            if all(x is None for x in scores_b):
                raise OproError(
                    f"no answer of {answers} has a label in {labels}; labels are matched by exact query text "
                    "(and answer text when the label file has an 'answer' column)"
                )
            name_b = "labels"
        else:
            assert judge_b is not None
            scores_b, name_b = scores_of(judge_b, template_b or template, score_from_b), judge_b

    report = agreement(scores_a, scores_b)
    # A yes/no judge against a 1-5 one: what can agree is the verdict at opro's pass mark (4).
    verdicts = any(s is not None and s.startswith("mlflow:") for s in (judge_a, judge_b))
    stats, dist = report.rich_tables(name_a=name_a, name_b=name_b, scores=(scores_a, scores_b) if verdicts else None)
    console = Console()
    console.print(stats)
    console.print(dist)


@judge_app.command("calibrate")
@_errors()
def judge_calibrate(
    config: Path = typer.Argument(..., help="Experiment TOML: its [data].dataset, models, retrieval and [judge] are used."),
    n: int = typer.Option(40, "--n", help="Questions sampled from the dataset (seeded)."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed (default: [experiment].seed)."),
    conditions: str = typer.Option(
        "reference,wrong,task,number,name,first-sentence", "--conditions",
        help="Comma list of reference, wrong (another question's reference), task (the RAG answer) and the "
             "near misses made from the reference without a model: number (one number changed), name (one name "
             "swapped for another reference's), first-sentence (cut to its first sentence). A near miss is "
             "judged only where it applies: up to 3 more judge calls per question, each reusing its question's "
             "prompt prefix on the embedded judge.",
    ),
    retest: int = typer.Option(
        5, "--retest", help="Answers per condition (reference, wrong, task) judged a second time without the cache."
    ),
    judge: str | None = typer.Option(
        None, "--judge", help="Judge model instead of [models.judge]: llamacpp:NAME or openai:MODEL[@BASE_URL]."
    ),
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
    import dataclasses

    from rich.console import Console

    from opro.agreement import parse_model_spec
    from opro.calibration import calibrate_experiment, calibration_record, write_calibration
    from opro.config import JudgeSection, load_config
    from opro.errors import ConfigError
    from opro.experiment import Experiment
    from opro.records import record_all
    from opro.tracking.commands import command_recorders

    cfg = load_config(config)
    overrides: dict[str, Any] = {}
    if template is not None:
        overrides["template"] = template
    if score_from is not None:
        overrides["score_from"] = score_from
    if max_tokens is not None:
        overrides["max_tokens"] = max_tokens
    if overrides:
        if overrides.get("score_from", "reply") not in ("reply", "logits", "auto"):
            raise ConfigError(f"--score-from must be reply, logits or auto, got {score_from!r}")
        cfg = dataclasses.replace(cfg, judge=JudgeSection(**{**dataclasses.asdict(cfg.judge), **overrides}))
    if judge is not None:
        cfg = dataclasses.replace(cfg, models=dataclasses.replace(cfg.models, judge=parse_model_spec(judge)))
    exp = Experiment(cfg, progress=progress)
    try:
        report, verdicts = calibrate_experiment(
            exp, n=n, seed=seed, conditions=[c.strip() for c in conditions.split(",") if c.strip()],
            retest=retest, progress=progress,
        )
    finally:
        exp.close()
    paths = write_calibration(report, verdicts, output_dir=cfg.output_dir)
    recorded = record_all(command_recorders(cfg, mlflow=mlflow), calibration_record(report, paths))
    console = Console()
    console.print(report.rich_table())
    console.print(report.contrast_table())
    for line in report.lines():
        console.print(line)
    for path in paths.values():
        typer.echo(f"wrote {path}")
    for where in recorded:
        typer.echo(where.where)

