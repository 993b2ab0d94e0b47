"""Golden datasets made, imported and split, then saved as an opro dataset directory (``opro dataset``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opro.data.dataset import Example, GoldenDataset
    from opro.data.generation import GenerationResult
    from opro.llm.pool import ModelSpec


@dataclass(frozen=True)
class SplitSizes:
    """The split asked for: sizes not given share what the given ones leave equally (held-out: the rest)."""

    exemplar: int = 3
    optimization: int | None = None
    validation: int | None = None
    heldout: int | None = None
    seed: int = 0

    def of(self, n: int) -> tuple[int, int, int, int | None]:
        """Exemplar, optimization, validation and held-out sizes for ``n`` examples."""
        given = self.exemplar + sum(v for v in (self.optimization, self.validation, self.heldout) if v is not None)
        unknown = sum(v is None for v in (self.optimization, self.validation, self.heldout))
        share, extra = divmod(max(0, n - given), unknown) if unknown else (0, 0)
        return (
            self.exemplar,
            share + (extra > 0) if self.optimization is None else self.optimization,  # an odd one out goes to search
            share if self.validation is None else self.validation,
            self.heldout,
        )


@dataclass(frozen=True)
class SavedSplit:
    """A split dataset, where it was saved, and what its split falls short of (None when nothing)."""

    dataset: GoldenDataset
    path: Path
    seed: int
    shortfall: str | None

    def line(self) -> str:
        assert self.dataset.split is not None
        sizes = ", ".join(f"{k} {v}" for k, v in self.dataset.split.sizes.items())
        return f"saved {len(self.dataset)} examples ({sizes}; seed {self.seed}) to {self.path}"


def save_split(dataset: GoldenDataset, out: str | Path, sizes: SplitSizes = SplitSizes()) -> SavedSplit:
    """Split ``dataset`` (seeded, leak-free) and save it as an opro dataset directory ``out``."""
    from opro.data.dataset import split_shortfall

    ex, opt, val, held = sizes.of(len(dataset))
    split = dataset.with_split(exemplar=ex, optimization=opt, validation=val, heldout=held, seed=sizes.seed)
    path = split.save(Path(str(out)))
    assert split.split is not None
    return SavedSplit(dataset=split, path=path, seed=sizes.seed, shortfall=split_shortfall(split.split))


def import_dataset(file: str | Path, out: str | Path, sizes: SplitSizes = SplitSizes(), *,
                   query_field: str | None = None, answer_field: str | None = None,
                   contexts_field: str | None = None) -> SavedSplit:
    """Import a LabelledRagDataset or QA records (fields found by name unless given), split and save it."""
    from opro.data.dataset import load_dataset

    fields = {
        k: v
        for k, v in (("query_field", query_field), ("answer_field", answer_field), ("contexts_field", contexts_field))
        if v is not None
    }
    return save_split(load_dataset(file, **fields), out, sizes)


def resplit_dataset(directory: str | Path, sizes: SplitSizes = SplitSizes()) -> SavedSplit:
    """Split a dataset directory again (replaces its split.json)."""
    from opro.data.dataset import DATASET_FILE, load_labelled_rag_dataset

    return save_split(load_labelled_rag_dataset(Path(directory) / DATASET_FILE), directory, sizes)


@dataclass(frozen=True)
class DatasetGenerated:
    """The generation and its split dataset, as saved (None when no example was kept)."""

    generation: GenerationResult
    saved: SavedSplit | None

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for d in self.generation.dropped:
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
        return (f"{len(self.generation.dataset)} examples from {self.generation.n_chunks} chunks; dropped: "
                + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"))


def generate_dataset(
    docs: Sequence[str],
    out: str | Path,
    *,
    model: ModelSpec,
    chunk_size: int = 512,
    chunk_overlap: int = 64,
    questions_per_chunk: int = 2,
    max_chunks: int | None = None,
    skip_bad: bool = False,
    cache: bool = True,
    sizes: SplitSizes = SplitSizes(),
    notice: Callable[[str], None] = lambda _: None,
) -> DatasetGenerated:
    """Generate a golden dataset from the documents ``docs`` with ``model`` (the generator), split it
    and save it to ``out``; ``notice`` hears each document file skipped (``skip_bad``)."""
    from opro.data.documents import load_documents
    from opro.data.generation import generate_examples
    from opro.llm.factory import ClientFactory, open_cache
    from opro.program.retrieval import chunk_documents

    loaded = load_documents(docs, skip_bad=skip_bad)
    for s in loaded.skipped:
        notice(f"skipped {s.path}: {s.reason}")
    chunks = chunk_documents(loaded.documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    with ClientFactory(cache=open_cache(enabled=cache)) as models:
        client = models.client(model, role="generator")
        result = generate_examples(
            chunks=chunks, llm=client, questions_per_chunk=questions_per_chunk, max_chunks=max_chunks
        )
    saved = save_split(result.dataset, out, sizes) if len(result.dataset) else None
    return DatasetGenerated(generation=result, saved=saved)


@dataclass(frozen=True)
class PoolGenerated:
    """What ``opro dataset pool`` did: the questions it asked for, the pool's new examples, and the pool file."""

    asked: int
    added: tuple[Example, ...]
    pool: int
    path: Path
    generation: tuple[GenerationResult, ...]

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for g in self.generation:
            for d in g.dropped:
                reasons[d.reason] = reasons.get(d.reason, 0) + 1
        short = (" (the documents gave no more: raise --questions-per-chunk or give more documents)"
                 if len(self.added) < self.asked else "")
        return (f"{len(self.added)} of {self.asked} pool questions added{short}; {self.pool} in {self.path}; "
                "dropped: " + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"))


def generate_pool(
    directory: str | Path,
    docs: Sequence[str],
    *,
    n: int,
    model: ModelSpec,
    chunk_size: int = 512,
    chunk_overlap: int = 64,
    questions_per_chunk: int = 2,
    skip_bad: bool = False,
    cache: bool = True,
    notice: Callable[[str], None] = lambda _: None,
) -> PoolGenerated:
    """Generate ``n`` more questions from the documents ``docs`` with ``model`` (the generator) into the pool
    of the opro dataset folder ``directory`` (:mod:`opro.data.pool`): each new against every question of the
    dataset and of the pool (held-out included), quality-filtered as a generated dataset is. The chunks no
    dataset question was asked of go first."""
    from opro.data.documents import load_documents
    from opro.data.generation import generate_examples, select_chunks
    from opro.data.pool import dataset_folder, load_pool, save_pool
    from opro.errors import ConfigError
    from opro.llm.factory import ClientFactory, open_cache
    from opro.program.retrieval import chunk_documents

    if n < 1:
        raise ConfigError(f"--pool must be at least 1 question, got {n}")
    if not docs:
        raise ConfigError(f"{directory}: the pool is generated from the documents the dataset was made from: "
                          "give them with --docs")
    dataset = dataset_folder(directory)
    pool = list(load_pool(directory, dataset=dataset))
    loaded = load_documents(docs, skip_bad=skip_bad)
    for s in loaded.skipped:
        notice(f"skipped {s.path}: {s.reason}")
    chunks = chunk_documents(loaded.documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    asked_of = {c for e in dataset.examples for c in e.reference_contexts}
    texts = [t for _, t in select_chunks(chunks, max_chunks=None)]
    texts = [t for t in texts if t not in asked_of] + [t for t in texts if t in asked_of]
    added: list[Example] = []
    results: list[GenerationResult] = []
    # In batches of about the chunks the questions still wanted need (a few are dropped), until enough.
    with ClientFactory(cache=open_cache(enabled=cache)) as models:
        client = models.client(model, role="generator")
        while texts and len(added) < n:
            take = max(1, -(-(n - len(added)) * 3 // (2 * questions_per_chunk)))
            batch, texts = texts[:take], texts[take:]
            done = generate_examples(chunks=batch, llm=client, questions_per_chunk=questions_per_chunk,
                                     exclude=[e.query for e in (*dataset.examples, *pool, *added)])
            results.append(done)
            added.extend(done.dataset.examples[: n - len(added)])
    path = save_pool(directory, [*pool, *added], dataset=dataset)
    return PoolGenerated(asked=n, added=tuple(added), pool=len(pool) + len(added), path=path, generation=tuple(results))
