"""A labelled pool of extra validation questions kept beside a dataset (``pool.json``).

Where the split holds too few validation questions for the claim asked (``opro plan`` says how many
would do), ``opro dataset pool`` generates more from the same documents, the way a dataset is
generated (:mod:`opro.data.generation`: the same prompts, the same quality filter), each question
deduplicated against every question of the dataset, held-out ones included, and against the pool
already there. The pool is in no split and never held out: the validation stage's extension asks
it after the split's unused questions (:func:`extension_questions`), and the verdict says how many of
its pairs came from it. ``pool.json`` is a LabelledRagDataset file plus the content hash of the
dataset it was deduplicated against: a pool whose dataset changed since is refused, not used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opro.data.dataset import DATASET_FILE, Example, GoldenDataset, load_labelled_rag_dataset
from opro.errors import DataError

POOL_FILE = "pool.json"


def pool_path(folder: str | Path) -> Path:
    return Path(folder) / POOL_FILE


def load_pool(folder: str | Path, *, dataset: GoldenDataset) -> tuple[Example, ...]:
    """The pool kept in the dataset folder ``folder`` (none: empty), checked against ``dataset``."""
    path = pool_path(folder)
    if not path.is_file():
        return ()
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot be read as a pool ({exc}); delete it or generate it again with "
                        "`opro dataset pool`") from exc
    if not isinstance(data, dict) or not isinstance(data.get("examples"), list):
        raise DataError(f"{path}: not a pool (expected an object with an 'examples' list)")
    if data.get("dataset_hash") != dataset.content_hash:
        raise DataError(f"{path}: the pool was made for other dataset contents (hash "
                        f"{str(data.get('dataset_hash'))[:12]} != {dataset.content_hash[:12]}), so it may repeat "
                        "their questions; delete it and generate it again with `opro dataset pool`")
    return tuple(Example.from_json(e, where=f"{path}: examples[{i}]") for i, e in enumerate(data["examples"]))


def save_pool(folder: str | Path, examples: Sequence[Example], *, dataset: GoldenDataset) -> Path:
    """Write ``examples`` as the pool of the dataset folder ``folder`` (made against ``dataset``)."""
    path = pool_path(folder)
    tmp = path.with_name(f".{path.name}.tmp")
    data = {"dataset_hash": dataset.content_hash, "examples": [e.to_json() for e in examples]}
    tmp.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def dataset_folder(folder: str | Path) -> GoldenDataset:
    """The split dataset of an opro dataset folder a pool is kept beside (refused: not one, or not split)."""
    from opro.data.dataset import load_dataset

    p = Path(folder)
    if not (p / DATASET_FILE).is_file():
        raise DataError(f"{p}: not an opro dataset folder (no {DATASET_FILE}); a pool is kept beside a dataset "
                        "made by `opro dataset generate` / `import` or by a run (<output_dir>/dataset)")
    dataset = load_dataset(p)
    if dataset.split is None:
        load_labelled_rag_dataset(p / DATASET_FILE)  # readable, only unsplit
        raise DataError(f"{p}: the dataset has no split, so no question is known to be outside the held-out one; "
                        "split it first with `opro dataset split`")
    return dataset


def pool_folder(*, dataset: Path | None, output_dir: Path) -> Path:
    """The dataset folder whose pool a config's runs extend into: its ``[data].dataset`` (``dataset``, resolved;
    None: not set) where it is a folder (the run copies only its dataset and split), else the run's own
    (``<output_dir>/dataset``)."""
    from opro.paths import RunDir

    return dataset if dataset is not None and dataset.is_dir() else RunDir(output_dir).dataset


def extension_questions(dataset: GoldenDataset, folder: str | Path | None) -> tuple[Example, ...]:
    """What a validation extension may ask, in order: the split's unused questions, then the pool kept in
    the dataset folder ``folder`` (None: there is none)."""
    return (*dataset.unused(), *(load_pool(folder, dataset=dataset) if folder is not None else ()))


__all__ = ["POOL_FILE", "dataset_folder", "extension_questions", "load_pool", "pool_folder", "pool_path",
           "save_pool"]
