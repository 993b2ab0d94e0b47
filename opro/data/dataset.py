"""Golden QA datasets: LlamaIndex ``LabelledRagDataset`` JSON, imports, and seeded leak-free splits.

An opro dataset directory holds ``rag_dataset.json`` (LlamaIndex's format, unchanged: ``examples[]``
with ``query``, ``query_by``, ``reference_contexts``, ``reference_answer``, ``reference_answer_by``)
and ``split.json`` (seed, requested sizes, the query indices of each split, and the content hash of
the dataset it was made for), so every later command sees the same split.

Splits are disjoint: *exemplar* (shown in the meta-prompt), *optimization* (scored during the search),
*validation* (scores the search's finalists once, at the end) and *heldout* (final comparison only).
Questions that are the same after normalization, near-duplicates, or that share a reference context
(generated questions share their chunk) always land in the same split, so no question leaks from
optimization into held-out. :func:`split_record` hashes each split so a later command can check that
the held-out questions of the dataset as it is now were not seen by an earlier optimization.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from opro.data.questions import (
    NearDuplicates,
    QuestionKey,
    is_near_duplicate,
    normalize_question,
    same_question,
)
from opro.errors import DataError

DATASET_FILE = "rag_dataset.json"
SPLIT_FILE = "split.json"
SPLIT_FORMAT = 1

QUERY_FIELDS = ("query", "question", "input", "prompt")
ANSWER_FIELDS = ("reference_answer", "answer", "reference", "output", "expected_answer")
CONTEXT_FIELDS = ("reference_contexts", "contexts", "context")

#: The dataset's splits, in the order questions are dealt to them (and listed in ``split.json``, the run's files
#: and parameters, ``[data.split]``): the one list. ``opro compare`` offers them held-out first
#: (:data:`opro.heldout.report.SPLITS`).
SplitName = Literal["exemplar", "optimization", "validation", "heldout"]
SPLIT_NAMES: tuple[SplitName, ...] = get_args(SplitName)


def _created_by(value: Any, *, where: str, name: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DataError(f"{where}: field {name!r} must be an object like {{'model_name': ..., 'type': 'ai'}} or null")
    return {"model_name": str(value.get("model_name") or ""), "type": str(value.get("type") or "")}


@dataclass(frozen=True)
class Example:
    query: str
    reference_answer: str
    reference_contexts: tuple[str, ...] = ()
    query_by: Mapping[str, str] | None = None
    reference_answer_by: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """A LabelledRagDataset example (LlamaIndex's key order)."""
        return {
            "query": self.query,
            "query_by": dict(self.query_by) if self.query_by is not None else None,
            "reference_contexts": list(self.reference_contexts),
            "reference_answer": self.reference_answer,
            "reference_answer_by": dict(self.reference_answer_by) if self.reference_answer_by is not None else None,
        }

    @classmethod
    def from_json(cls, data: Any, *, where: str) -> Example:
        if not isinstance(data, Mapping):
            raise DataError(f"{where}: an example must be a JSON object, got {type(data).__name__}")
        query = data.get("query")
        if not isinstance(query, str) or not query.strip():
            raise DataError(f"{where}: field 'query' is missing or empty")
        answer = data.get("reference_answer")
        if not isinstance(answer, str) or not answer.strip():
            raise DataError(f"{where}: field 'reference_answer' is missing or empty")
        contexts = data.get("reference_contexts") or []
        if isinstance(contexts, str) or not all(isinstance(c, str) for c in contexts):
            raise DataError(f"{where}: field 'reference_contexts' must be a list of strings")
        return cls(
            query=query,
            reference_answer=answer,
            reference_contexts=tuple(contexts),
            query_by=_created_by(data.get("query_by"), where=where, name="query_by"),
            reference_answer_by=_created_by(data.get("reference_answer_by"), where=where, name="reference_answer_by"),
        )


def content_hash(examples: Iterable[Example]) -> str:
    blob = json.dumps([e.to_json() for e in examples], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Split:
    seed: int
    exemplar: tuple[int, ...]
    optimization: tuple[int, ...]
    heldout: tuple[int, ...]
    dataset_hash: str
    #: Scored only at the end of a search, to pick a finalist without the winner's curse of the search.
    validation: tuple[int, ...] = ()
    #: What was asked for (a split may come out smaller when duplicate questions are kept together).
    requested: Mapping[str, int | None] = field(default_factory=dict)

    def indices(self, name: SplitName) -> tuple[int, ...]:
        if name not in SPLIT_NAMES:
            raise DataError(f"unknown split {name!r}; use one of {', '.join(SPLIT_NAMES)}")
        return getattr(self, name)  # type: ignore[no-any-return]

    @property
    def sizes(self) -> dict[str, int]:
        return {n: len(self.indices(n)) for n in SPLIT_NAMES}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SPLIT_FORMAT,
            "seed": self.seed,
            "requested": dict(self.requested),
            "sizes": self.sizes,
            "dataset_hash": self.dataset_hash,
            "exemplar": list(self.exemplar),
            "optimization": list(self.optimization),
            "validation": list(self.validation),
            "heldout": list(self.heldout),
        }

    @classmethod
    def from_json(cls, data: Any, *, where: str) -> Split:
        try:
            return cls(
                seed=int(data["seed"]),
                exemplar=tuple(int(i) for i in data["exemplar"]),
                optimization=tuple(int(i) for i in data["optimization"]),
                validation=tuple(int(i) for i in data.get("validation", ())),
                heldout=tuple(int(i) for i in data["heldout"]),
                dataset_hash=str(data["dataset_hash"]),
                requested=dict(data.get("requested") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = (
                f"no {exc.args[0]!r} key" if isinstance(exc, KeyError) and exc.args
                else "not an object of seed, dataset_hash and exemplar / optimization / heldout lists of example numbers"
            )
            raise DataError(
                f"{where}: not a valid split file ({what}); re-split the folder with `opro dataset split`"
            ) from exc


#: Cosine similarity of two questions' embeddings at and above which they are paraphrases (one split).
PARAPHRASE_COSINE = 0.9

#: Embeds texts (an :class:`opro.program.retrieval.Embedder`'s ``embed``): rows of a float array.
Embed = Callable[[Sequence[str]], Any]


def paraphrase_pairs(left: Sequence[str], right: Sequence[str], *, embed: Embed,
                     threshold: float = PARAPHRASE_COSINE) -> list[tuple[int, int, float]]:
    """(i, j, cosine) of every question ``left[i]`` whose embedding is at least ``threshold`` similar
    to ``right[j]``'s: paraphrases that share no wording for the lexical check to see."""
    import numpy as np

    if not left or not right:
        return []
    a, b = (np.asarray(embed(list(x)), dtype=float) for x in (left, right))
    a /= np.linalg.norm(a, axis=1, keepdims=True) + 1e-12
    b /= np.linalg.norm(b, axis=1, keepdims=True) + 1e-12
    sim = a @ b.T
    return [(int(i), int(j), float(sim[i, j])) for i, j in zip(*np.nonzero(sim >= threshold), strict=True)]


def related_groups(examples: Sequence[Example], *, embed: Embed | None = None) -> list[list[int]]:
    """Indices of related examples, grouped by union-find, in order of their first index.

    Related: the same normalized question, near-duplicate questions (:func:`same_question`), a
    shared reference context (normalized; generated questions carry their chunk as context), or,
    with ``embed``, paraphrases (:func:`paraphrase_pairs`).
    """
    parent = list(range(len(examples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)

    first: dict[str, int] = {}
    for i, e in enumerate(examples):
        keys = [f"q:{normalize_question(e.query)}"]
        keys += [f"c:{' '.join(c.split()).casefold()}" for c in e.reference_contexts if c.strip()]
        for key in keys:
            union(first.setdefault(key, i), i)
    questions = [QuestionKey.of(e.query) for e in examples]
    # Every pair (i < j) once; j outer so that one matcher keeps its index of question j. The groups
    # are the connected components of the relation, whatever order the pairs are visited in.
    for j in range(1, len(questions)):
        matcher = difflib.SequenceMatcher(None, "", questions[j].again)
        for i in range(j):
            if find(i) != find(j) and questions[i].same_as(questions[j], matcher):
                union(i, j)
    if embed is not None:
        texts = [normalize_question(e.query) for e in examples]
        for i, j, _ in paraphrase_pairs(texts, texts, embed=embed):
            if i < j:
                union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(examples)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def make_split(
    examples: Sequence[Example],
    *,
    exemplar: int,
    optimization: int,
    heldout: int | None,
    seed: int,
    validation: int = 0,
    embed: Embed | None = None,
    stratify: Callable[[Example], str] | None = None,
) -> Split:
    """Seeded disjoint split. ``heldout=None`` takes every remaining example.

    Examples are grouped by :func:`related_groups` (with ``embed``, paraphrases too); a group is
    placed whole into the first split (in shuffled order) with room for it, so related questions
    never straddle two splits. With ``stratify`` (a group's stratum is its first question's), the
    shuffled strata are interleaved in proportion, so every split gets its share of each (for example
    of the questions the corpus cannot answer).
    """
    limits: dict[str, int | None] = dict(zip(SPLIT_NAMES, (exemplar, optimization, validation, heldout), strict=True))
    for name, size in limits.items():
        if size is not None and size < 0:
            raise DataError(f"split size {name}={size} must be >= 0")
    order = related_groups(examples, embed=embed)
    random.Random(seed).shuffle(order)
    if stratify is not None:
        order = _interleaved(order, key=lambda g: stratify(examples[g[0]]))
    wanted = exemplar + optimization + validation + (heldout or 0)
    if wanted > len(examples):
        raise DataError(
            f"split sizes exemplar={exemplar} + optimization={optimization} + validation={validation}"
            + ("" if heldout is None else f" + heldout={heldout}") + f" = {wanted} "
            f"exceed the {len(examples)} examples of the dataset; choose smaller sizes"
        )
    parts: dict[str, list[int]] = {n: [] for n in SPLIT_NAMES}
    for group in order:
        for name in SPLIT_NAMES:
            limit = limits[name]
            if limit is None or len(parts[name]) + len(group) <= limit:
                parts[name].extend(group)
                break
    return Split(
        seed=seed,
        exemplar=tuple(sorted(parts["exemplar"])),
        optimization=tuple(sorted(parts["optimization"])),
        validation=tuple(sorted(parts["validation"])),
        heldout=tuple(sorted(parts["heldout"])),
        dataset_hash=content_hash(examples),
        requested=dict(limits),
    )


def _interleaved(groups: list[list[int]], *, key: Callable[[list[int]], str]) -> list[list[int]]:
    """The groups, each stratum in its own (shuffled) order, merged so that every prefix holds each
    stratum in proportion to its size (the largest deficit goes next)."""
    strata: dict[str, list[list[int]]] = {}
    for g in groups:
        strata.setdefault(key(g), []).append(g)
    total = len(groups)
    taken = dict.fromkeys(strata, 0)
    out: list[list[int]] = []
    for n in range(1, total + 1):
        name = max((s for s in strata if taken[s] < len(strata[s])),
                   key=lambda s: n * len(strata[s]) / total - taken[s])
        out.append(strata[name][taken[name]])
        taken[name] += 1
    return out


def folder_split_warning(dataset: GoldenDataset, *, asked: Any, source: str, name: str) -> str | None:
    """What to say when an opro dataset folder's own split.json differs from ``[data.split]`` (``asked``)."""
    assert dataset.split is not None
    if dataset.split.sizes == {n: getattr(asked, n) for n in SPLIT_NAMES} and dataset.split.seed == asked.seed:
        return None
    sizes = ", ".join(f"{k} {v}" for k, v in dataset.split.sizes.items())
    return (f"{source}: [data].dataset {name} is an opro dataset folder with its own split.json ({sizes}; seed "
            f"{dataset.split.seed}), which is used; [data.split] is ignored. To re-split with [data.split], point "
            "[data].dataset at its rag_dataset.json")


def split_shortfall(split: Split) -> str | None:
    """A warning when a split came out smaller than requested (related questions are kept together,
    so a group may not fit the room left), else ``None``."""
    short = [
        f"{n} {split.sizes[n]} (asked {split.requested[n]})"
        for n in SPLIT_NAMES
        if split.requested.get(n) is not None and split.sizes[n] != split.requested[n]
    ]
    if not short:
        return None
    return (
        "the split came out smaller than requested: " + ", ".join(short) + "; duplicate, near-duplicate and "
        "same-context questions are kept in one split, so a group can be too big for the room left. "
        "Use more examples or other [data.split] sizes"
    )


def check_split_fits(dataset: GoldenDataset, sizes: Mapping[SplitName, int], *, where: str, more: str = "") -> None:
    """Refuse ``[data.split]`` sizes (each split's, in :data:`SPLIT_NAMES` order) that ask for more questions than
    ``dataset`` holds (one the split is made from, not a folder with its own split.json); ``more``: what else
    the user may do."""
    if dataset.split is None and sum(sizes.values()) > len(dataset):
        asked = " + ".join(f"{n} {name.replace('heldout', 'held-out')}" for name, n in sizes.items())
        raise DataError(f"{where}: [data.split] asks for {sum(sizes.values())} examples ({asked}) but the dataset has "
                        f"{len(dataset)}; lower the split sizes{more}")


def split_record(dataset: GoldenDataset, *, extension: Sequence[Example] = ()) -> dict[str, Any]:
    """What an optimization saw: sha256 of each normalized question per split, and of the split;
    ``extension``: the questions outside the split its validation may extend into (kept as their own
    ``extension`` entry, checked like the others).

    Saved by ``opro optimize`` (``split_record.json``, ``summary.json``, the Optuna study) so that
    ``compare`` / ``evaluate --split heldout`` can refuse a held-out set that overlaps it later, even
    after the split was re-made in place. The normalized texts of the non-held-out splits are kept
    too, for the near-duplicate check.
    """
    if dataset.split is None:
        raise DataError("the dataset has no split; create one with .with_split(...) or `opro dataset import`")
    record: dict[str, Any] = {
        "format": SPLIT_FORMAT,
        "seed": dataset.split.seed,
        "dataset_hash": dataset.content_hash,
        "split_sha256": split_hash(dataset.split),
        "questions": {},
        "normalized": {},
    }
    for name in SPLIT_NAMES:
        normalized = [normalize_question(e.query) for e in dataset.examples_in(name)]
        record["questions"][name] = [question_hash(n) for n in normalized]
        if name != "heldout":
            record["normalized"][name] = normalized
    if extension:
        normalized = [normalize_question(e.query) for e in extension]
        record["questions"]["extension"] = [question_hash(n) for n in normalized]
        record["normalized"]["extension"] = normalized
    return record


def question_hash(normalized: str) -> str:
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


def question_hashes(queries: Iterable[str]) -> tuple[str, ...]:
    """The decision ledger's hashes of ``queries`` (normalized, each once, in order)."""
    from opro.hashing import short_hashes

    return short_hashes([question_hash(normalize_question(q)) for q in dict.fromkeys(queries)])


def split_hash(split: Split) -> str:
    """sha256 of the split.json content (canonical JSON, so formatting does not matter)."""
    blob = json.dumps(split.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class GoldenDataset:
    examples: tuple[Example, ...]
    split: Split | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "examples", tuple(self.examples))
        if self.split is not None:
            n = len(self.examples)
            seen: set[int] = set()
            for name in SPLIT_NAMES:
                for i in self.split.indices(name):
                    if not 0 <= i < n:
                        raise DataError(f"split {name!r} refers to example {i}, but the dataset has {n} examples")
                    if i in seen:
                        raise DataError(f"example {i} is in more than one split")
                    seen.add(i)

    def __len__(self) -> int:
        return len(self.examples)

    def made_by(self) -> dict[str, dict[str, int]]:
        """How many questions and how many reference answers each model (or person) wrote, as
        ``{"questions": {"MODEL (TYPE)": n}, "answers": {...}}``; ``unknown`` where nothing says."""
        out: dict[str, dict[str, int]] = {}
        for what, attr in (("questions", "query_by"), ("answers", "reference_answer_by")):
            counts: dict[str, int] = {}
            for e in self.examples:
                by = getattr(e, attr)
                key = f"{by.get('model_name') or '?'} ({by.get('type') or '?'})" if by else "unknown"
                counts[key] = counts.get(key, 0) + 1
            out[what] = dict(sorted(counts.items()))
        return out

    @property
    def content_hash(self) -> str:
        return content_hash(self.examples)

    def with_split(
        self, *, exemplar: int, optimization: int, heldout: int | None, seed: int, validation: int = 0,
        embed: Embed | None = None, stratify: Callable[[Example], str] | None = None,
    ) -> GoldenDataset:
        return replace(
            self,
            split=make_split(
                self.examples, exemplar=exemplar, optimization=optimization, validation=validation,
                heldout=heldout, seed=seed, embed=embed, stratify=stratify,
            ),
        )

    def examples_in(self, name: SplitName) -> tuple[Example, ...]:
        if self.split is None:
            raise DataError("the dataset has no split; create one with .with_split(...) or `opro dataset import`")
        return tuple(self.examples[i] for i in self.split.indices(name))

    def unused(self) -> tuple[Example, ...]:
        """The examples in no split, in an order seeded by the split's seed: the pool a validation
        extension draws from. Never held-out (groups of related questions are placed whole, so none of
        these is a near-duplicate of a held-out one either)."""
        if self.split is None:
            raise DataError("the dataset has no split; create one with .with_split(...) or `opro dataset import`")
        placed = {i for name in SPLIT_NAMES for i in self.split.indices(name)}
        rest = [i for i in range(len(self.examples)) if i not in placed]
        random.Random(f"unused-{self.split.seed}").shuffle(rest)
        return tuple(self.examples[i] for i in rest)

    def to_json(self) -> dict[str, Any]:
        return {"examples": [e.to_json() for e in self.examples]}

    def save(self, directory: str | Path) -> Path:
        """Write ``rag_dataset.json`` (+ ``split.json`` when split) into ``directory``; returns it."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        _write_json(out / DATASET_FILE, self.to_json())
        split_path = out / SPLIT_FILE
        if self.split is not None:
            _write_json(split_path, self.split.to_json())
        elif split_path.exists():
            split_path.unlink()  # a stale split would no longer match the examples
        return out

    @classmethod
    def load(cls, path: str | Path) -> GoldenDataset:
        return load_dataset(path)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def _unreadable(path: Path, exc: OSError | UnicodeDecodeError) -> DataError:
    """Why ``path`` cannot be read; bytes that are not UTF-8 are named by their line, as a parse error is."""
    if isinstance(exc, UnicodeDecodeError):
        line = exc.object[: exc.start].count(b"\n") + 1
        return DataError(f"{path}: line {line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save the file "
                         "as UTF-8")
    return DataError(f"{path}: cannot be read ({exc})")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc) from exc


def load_labelled_rag_dataset(path: str | Path) -> GoldenDataset:
    p = Path(path)
    data = _read_json(p)
    if not isinstance(data, Mapping) or not isinstance(data.get("examples"), list):
        raise DataError(f"{p}: not a LabelledRagDataset file (expected an object with an 'examples' list)")
    examples = tuple(Example.from_json(e, where=f"{p}: examples[{i}]") for i, e in enumerate(data["examples"]))
    if not examples:
        raise DataError(f"{p}: the dataset has no examples")
    return GoldenDataset(examples)


def load_dataset(path: str | Path, **fields: Any) -> GoldenDataset:
    """Load an opro dataset directory, a LabelledRagDataset JSON, or QA records (JSON / JSONL / CSV).

    Extra keyword arguments (``query_field``, ``answer_field``, ``contexts_field``) go to
    :func:`import_qa` for plain records.
    """
    p = Path(path)
    if p.is_dir():
        ds_path = p / DATASET_FILE
        if not ds_path.exists():
            raise DataError(f"{p}: not an opro dataset directory (no {DATASET_FILE}); create one with `opro dataset import`")
        dataset = load_labelled_rag_dataset(ds_path)
        split_path = p / SPLIT_FILE
        if split_path.exists():
            split = Split.from_json(_read_json(split_path), where=str(split_path))
            if split.dataset_hash != dataset.content_hash:
                raise DataError(
                    f"{split_path}: the split was made for different dataset contents (hash {split.dataset_hash[:12]} "
                    f"!= {dataset.content_hash[:12]}); {ds_path} changed after splitting: re-import it to re-split"
                )
            try:
                dataset = replace(dataset, split=split)
            except DataError as exc:
                raise DataError(f"{split_path}: {exc}; re-split the folder with `opro dataset split`") from None
        return dataset
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if p.suffix.lower() == ".json" and not fields:
        data = _read_json(p)
        if isinstance(data, Mapping) and "examples" in data:
            return load_labelled_rag_dataset(p)
    return import_qa(p, **fields)


def _pick_field(explicit: str | None, candidates: Sequence[str], keys: Iterable[str], *, what: str, where: str) -> str:
    keys = list(keys)
    if explicit is not None:
        return explicit
    for c in candidates:
        if c in keys:
            return c
    raise DataError(
        f"{where}: no {what} field found (looked for {', '.join(candidates)}; the record has {', '.join(keys) or 'no fields'}); "
        f"name it with --{what}-field (in a config: [data].{what}_field)"
    )


def read_records(
    path: str | Path, *, list_keys: Sequence[str] = ("examples", "data")
) -> list[tuple[str, Mapping[str, Any]]]:
    """(location, record) pairs from a JSON file (a list, or an object whose first present key of
    ``list_keys`` holds the list), a JSONL or a CSV file; empty when the file holds no record. The
    location (``FILE: line N``) is what an error about the record names."""
    p = Path(path)
    suffix = p.suffix.lower()
    out: list[tuple[str, Mapping[str, Any]]] = []
    if suffix == ".jsonl":
        try:
            lines = p.read_text(encoding="utf-8-sig").splitlines()  # -sig: read past a byte-order mark
        except (OSError, UnicodeDecodeError) as exc:
            raise _unreadable(p, exc) from exc
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}: line {n}: invalid JSON ({exc.msg})") from exc
            if not isinstance(rec, Mapping):
                raise DataError(f"{p}: line {n}: expected a JSON object, got {type(rec).__name__}")
            out.append((f"{p}: line {n}", rec))
    elif suffix == ".csv":
        try:
            text = p.read_text(encoding="utf-8-sig")  # whole, so that bytes which are not UTF-8 are placed
        except (OSError, UnicodeDecodeError) as exc:
            raise _unreadable(p, exc) from exc
        try:
            for n, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):  # row 1: the header
                out.append((f"{p}: row {n}", row))
        except csv.Error as exc:
            raise DataError(f"{p}: cannot be read as CSV ({exc})") from exc
    elif suffix == ".json":
        data = _read_json(p)
        if isinstance(data, Mapping):
            data = next((data[k] for k in list_keys if k in data), None)
        if not isinstance(data, list):
            keys = " or ".join(repr(k) for k in list_keys)
            raise DataError(f"{p}: expected a JSON list of records (or an object with a {keys} list)")
        for n, rec in enumerate(data):
            if not isinstance(rec, Mapping):
                raise DataError(f"{p}: record {n}: expected a JSON object, got {type(rec).__name__}")
            out.append((f"{p}: record {n}", rec))
    else:
        raise DataError(f"{p}: unsupported dataset file type {suffix!r}; use .json, .jsonl or .csv (or an opro dataset dir)")
    return out


def _contexts(value: Any, *, where: str, name: str) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):  # a JSON list inside a CSV cell
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return (value,)
        else:
            return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise DataError(f"{where}: field {name!r} must be a string or a list of strings")


def import_qa(
    path: str | Path,
    *,
    query_field: str | None = None,
    answer_field: str | None = None,
    contexts_field: str | None = None,
    created_by: Mapping[str, str] | None = None,
) -> GoldenDataset:
    """Plain question/answer records from JSON, JSONL or CSV; field names detected unless given.

    ``created_by`` (e.g. ``{"model_name": "", "type": "human"}``) fills ``query_by`` and
    ``reference_answer_by``; default null (unknown), as LlamaIndex allows.
    """
    p = Path(path)
    records = read_records(p)
    if not records:
        raise DataError(f"{p}: no records found")
    first_where, first = records[0]
    qf = _pick_field(query_field, QUERY_FIELDS, first.keys(), what="query", where=first_where)
    af = _pick_field(answer_field, ANSWER_FIELDS, first.keys(), what="answer", where=first_where)
    cf = contexts_field
    if cf is None:
        cf = next((c for c in CONTEXT_FIELDS if c in first), None)
    by = dict(created_by) if created_by is not None else None
    examples: list[Example] = []
    for where, rec in records:
        for name in (qf, af) + ((contexts_field,) if contexts_field else ()):
            if name not in rec:
                raise DataError(f"{where}: missing field {name!r} (the record has: {', '.join(map(str, rec.keys()))})")
        q, a = rec[qf], rec[af]
        if not isinstance(q, str) or not q.strip():
            raise DataError(f"{where}: field {qf!r} is empty or not text")
        if not isinstance(a, str) or not a.strip():
            raise DataError(f"{where}: field {af!r} is empty or not text")
        ctx = _contexts(rec.get(cf) if cf else None, where=where, name=cf or "")
        examples.append(
            Example(query=q.strip(), reference_answer=a.strip(), reference_contexts=ctx, query_by=by, reference_answer_by=by)
        )
    return GoldenDataset(tuple(examples))


__all__ = [
    "DATASET_FILE",
    "PARAPHRASE_COSINE",
    "SPLIT_FILE",
    "SPLIT_NAMES",
    "Example",
    "GoldenDataset",
    "NearDuplicates",
    "QuestionKey",
    "Split",
    "SplitName",
    "check_split_fits",
    "content_hash",
    "folder_split_warning",
    "import_qa",
    "is_near_duplicate",
    "load_dataset",
    "load_labelled_rag_dataset",
    "make_split",
    "normalize_question",
    "paraphrase_pairs",
    "question_hash",
    "question_hashes",
    "read_records",
    "related_groups",
    "same_question",
    "split_hash",
    "split_record",
    "split_shortfall",
]
