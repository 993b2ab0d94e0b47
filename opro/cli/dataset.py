"""`opro dataset`: golden QA datasets (generate, import, split, show, pool) and corpora."""

from __future__ import annotations

import typer

from opro.cli._common import _errors, _listing
from opro.workflows.dataset import SavedSplit, SplitSizes

dataset_app = typer.Typer(help="Golden QA datasets: generate, import, split, show, pool; corpora to run on.", no_args_is_help=True, rich_markup_mode=None)


def _show_saved(saved: SavedSplit) -> None:
    typer.echo(saved.line())
    if saved.shortfall:
        typer.echo(f"warning: {saved.shortfall}", err=True)


# The generator's options, shared by `opro dataset generate` and `opro dataset pool`.
_CHUNK_SIZE_OPT = typer.Option(512, "--chunk-size", min=32, help="chunk size in tokens")
_CHUNK_OVERLAP_OPT = typer.Option(64, "--chunk-overlap", min=0, help="chunk overlap in tokens")
_QUESTIONS_PER_CHUNK_OPT = typer.Option(2, "--questions-per-chunk", min=1)
_BACKEND_OPT = typer.Option("llamacpp", "--backend", help="llamacpp | openai")
_MODEL_OPT = typer.Option("qwen2.5-coder-1.5b-instruct", "--model", help="generator model (embedded name, GGUF path or API id)")
_BASE_URL_OPT = typer.Option(None, "--base-url", help="OpenAI-compatible server URL")
_API_KEY_ENV_OPT = typer.Option("OPENAI_API_KEY", "--api-key-env", help="NAME of the variable holding the API key")
_N_THREADS_OPT = typer.Option(None, "--n-threads", min=1, help="llama.cpp threads [default: the usable cores other processes leave free]")
_SKIP_BAD_OPT = typer.Option(False, "--skip-bad", help="skip unusable document files instead of failing")
_CACHE_OPT = typer.Option(True, "--cache/--no-cache", help="use the call cache (reruns are free)")
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
    chunk_size: int = _CHUNK_SIZE_OPT,
    chunk_overlap: int = _CHUNK_OVERLAP_OPT,
    questions_per_chunk: int = _QUESTIONS_PER_CHUNK_OPT,
    max_chunks: int | None = typer.Option(None, "--max-chunks", min=1, help="use at most N chunks, evenly spaced"),
    backend: str = _BACKEND_OPT,
    model: str = _MODEL_OPT,
    base_url: str | None = _BASE_URL_OPT,
    api_key_env: str = _API_KEY_ENV_OPT,
    n_threads: int | None = _N_THREADS_OPT,
    skip_bad: bool = _SKIP_BAD_OPT,
    cache: bool = _CACHE_OPT,
    exemplar: int = _EXEMPLAR_OPT,
    optimization: int | None = _OPTIMIZATION_OPT,
    validation: int | None = _VALIDATION_OPT,
    heldout: int | None = _HELDOUT_OPT,
    seed: int = _SEED_OPT,
) -> None:
    """Generate a golden dataset from documents with the strong model, split it and save it."""
    from opro.llm.pool import ModelSpec
    from opro.workflows.dataset import generate_dataset

    spec = ModelSpec(backend=backend, model=model, base_url=base_url, api_key_env=api_key_env,  # type: ignore[arg-type]
                     n_threads=n_threads)
    done = generate_dataset(
        docs, out, model=spec, chunk_size=chunk_size, chunk_overlap=chunk_overlap, max_chunks=max_chunks,
        questions_per_chunk=questions_per_chunk, skip_bad=skip_bad, cache=cache,
        sizes=SplitSizes(exemplar, optimization, validation, heldout, seed), notice=lambda s: typer.echo(s, err=True),
    )
    typer.echo(done.summary(), err=True)
    if done.saved is None:
        raise typer.Exit(code=1)
    _show_saved(done.saved)


@dataset_app.command("pool")
@_errors()
def dataset_pool(
    directory: str = typer.Argument(..., help="opro dataset directory (split) to keep the pool beside"),
    pool: int = typer.Option(..., "--pool", help="questions to add to the pool (what `opro plan` says is missing)"),
    docs: list[str] = typer.Option([], "--docs", help="the documents the dataset was made from (repeatable)"),
    chunk_size: int = _CHUNK_SIZE_OPT,
    chunk_overlap: int = _CHUNK_OVERLAP_OPT,
    questions_per_chunk: int = _QUESTIONS_PER_CHUNK_OPT,
    backend: str = _BACKEND_OPT,
    model: str = _MODEL_OPT,
    base_url: str | None = _BASE_URL_OPT,
    api_key_env: str = _API_KEY_ENV_OPT,
    n_threads: int | None = _N_THREADS_OPT,
    skip_bad: bool = _SKIP_BAD_OPT,
    cache: bool = _CACHE_OPT,
) -> None:
    """Generate more validation questions from the same documents into the dataset's pool (pool.json): new
    against every question of the dataset, never held out; the validation extension asks them last."""
    from opro.llm.pool import ModelSpec
    from opro.workflows.dataset import generate_pool

    spec = ModelSpec(backend=backend, model=model, base_url=base_url, api_key_env=api_key_env,  # type: ignore[arg-type]
                     n_threads=n_threads)
    done = generate_pool(directory, docs, n=pool, model=spec, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                         questions_per_chunk=questions_per_chunk, skip_bad=skip_bad, cache=cache,
                         notice=lambda s: typer.echo(s, err=True))
    typer.echo(done.summary())


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
    from opro.workflows.dataset import import_dataset

    sizes = SplitSizes(exemplar, optimization, validation, heldout, seed)
    _show_saved(import_dataset(file, out, sizes, query_field=query_field, answer_field=answer_field,
                               contexts_field=contexts_field))


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
    from opro.workflows.dataset import resplit_dataset

    _show_saved(resplit_dataset(directory, SplitSizes(exemplar, optimization, validation, heldout, seed)))


@dataset_app.command("show")
@_errors()
def dataset_show(
    directory: str = typer.Argument(..., help="opro dataset directory or dataset file"),
    n: int = typer.Option(3, "-n", "--examples", min=0, help="examples to print"),
) -> None:
    """Sizes, split sizes, generating models and a few examples."""
    from rich.console import Console

    from opro.data.dataset import load_dataset

    dataset = load_dataset(directory)
    console = Console()
    console.print(f"[bold]{directory}[/]: {len(dataset)} examples, content hash {dataset.content_hash[:12]}")
    if dataset.split is not None:
        sizes = ", ".join(f"{k} {v}" for k, v in dataset.split.sizes.items())
        console.print(f"split (seed {dataset.split.seed}): {sizes}")
    else:
        console.print("no split (create one with `opro dataset split`)")
    for what, models in dataset.made_by().items():
        console.print(f"{what} by: " + ", ".join(f"{k}: {v}" for k, v in models.items()))
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
    from opro.data.corpus import QUICKSTART_TOPICS, write_quickstart_corpus

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
    from opro.data.corpus import LLAMA2_DATASET_URL, LLAMA2_PAPER_URL, fetch_llama2_paper

    result = fetch_llama2_paper(
        out, paper_url=paper_url or LLAMA2_PAPER_URL, dataset_url=dataset_url or LLAMA2_DATASET_URL, force=force
    )
    typer.echo(f"paper: {result.paper}\ndataset: {result.dataset}")
    typer.echo(f"next: opro dataset import {result.dataset} --out <dataset dir>", err=True)

