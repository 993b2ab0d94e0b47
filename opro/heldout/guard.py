"""The held-out guard: a question called held-out was never seen by the optimization that tuned a prompt.

``opro compare`` and ``opro evaluate --split heldout`` refuse (:class:`~opro.errors.LeakageError`)
when a held-out question (normalized, or as a near-duplicate or, with embeddings, a paraphrase) also
appears in the exemplar, optimization or validation split: of this experiment as it is now
(:func:`check_heldout_leakage`), as `opro optimize` recorded it (:func:`check_heldout_against_record`),
or of the run a compared prompt came from (:func:`check_prompt_source`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import DataError, LeakageError
from opro.paths import RunDir

if TYPE_CHECKING:
    from opro.data.dataset import Embed, GoldenDataset
    from opro.export.sources import ResolvedPrompt


def _first_five(items: Sequence[str]) -> str:
    """The first five items of an error listing, and how many more there are."""
    more = f" and {len(items) - 5} more" if len(items) > 5 else ""
    return "; ".join(items[:5]) + more


def check_heldout_leakage(
    dataset: GoldenDataset, *, other_questions: Mapping[str, Sequence[str]] | None = None
) -> None:
    """Raise :class:`DataError` if a held-out question also appears among exemplar / optimization ones.

    Questions are compared normalized (case, punctuation, whitespace). ``other_questions`` adds
    more questions an optimizer saw, by where they come from (another run's splits).
    """
    from opro.data.dataset import normalize_question

    held = {normalize_question(e.query): e.query for e in dataset.examples_in("heldout")}
    seen: dict[str, list[str]] = {}
    sources: dict[str, Sequence[str]] = {
        "exemplar split": [e.query for e in dataset.examples_in("exemplar")],
        "optimization split": [e.query for e in dataset.examples_in("optimization")],
        "validation split": [e.query for e in dataset.examples_in("validation")],
    }
    sources.update(other_questions or {})
    for where, questions in sources.items():
        for q in questions:
            key = normalize_question(q)
            if key in held:
                seen.setdefault(held[key], []).append(where)
    if seen:
        listed = _first_five([f"{q!r} (also in {', '.join(sorted(set(w)))})" for q, w in seen.items()])
        raise LeakageError(
            f"refusing to call this comparison held-out: {len(seen)} held-out question(s) were seen during "
            f"optimization: {listed}. Re-split the dataset (for example another [data.split].seed in a new "
            "output_dir) or compare with split='optimization' and do not report it as held-out"
        )


LEAKAGE_RECORDED = "held-out questions checked against the split recorded by `opro optimize` and against the current split"
LEAKAGE_CURRENT_ONLY = (
    "held-out questions checked against the current split only: no split record of `opro optimize` was found"
)


def load_split_record(output_dir: str | Path) -> dict[str, Any] | None:
    """The split record `opro optimize` left in ``output_dir`` (``split_record.json``, else ``summary.json``)."""
    return RunDir(Path(output_dir)).read_split_record()


def check_heldout_against_record(dataset: GoldenDataset, *, record: Mapping[str, Any], where: str = "the split record",
                                 embed: Embed | None = None) -> None:
    """Raise :class:`DataError` if the held-out questions of ``dataset`` as it is now were seen by the
    optimization that wrote ``record`` (see :func:`opro.data.dataset.split_record`), or the split changed.

    Held-out questions are matched by the sha256 of their normalized text and, where the record keeps
    the normalized texts, as near-duplicates.
    """
    from opro.data.dataset import split_hash

    if dataset.split is None:
        raise DataError("the dataset has no split; create one with `opro dataset import`")
    moved = _seen_in_record(dataset, record, embed=embed)
    changed = record["split_sha256"] != split_hash(dataset.split)
    if not moved and not changed:
        return
    was = f"seed {record.get('seed')}" if record.get("seed") is not None else "the recorded split"
    todo = (
        f"restore the [data.split] settings the optimization used ({was}; now seed {dataset.split.seed}), "
        "or run `opro optimize` again into a new output_dir and compare that run"
    )
    if moved:
        listed = _first_five([f"{q!r} (was in the {n} split)" for q, n in moved.items()])
        raise LeakageError(
            f"refusing to call this held-out: {len(moved)} held-out question(s) were seen by the optimization "
            f"recorded in {where}: {listed}"
            + (" (the split changed since it was recorded)" if changed else "") + f". To fix: {todo}"
        )
    raise LeakageError(
        f"refusing to call this held-out: the split changed since the optimization recorded it in {where} "
        f"(split.json hash {str(record['split_sha256'])[:12]} != {split_hash(dataset.split)[:12]}). To fix: {todo}"
    )


def _seen_in_record(dataset: GoldenDataset, record: Mapping[str, Any], *, embed: Embed | None = None) -> dict[str, str]:
    """Held-out questions of ``dataset`` that ``record`` lists as seen (exactly, by the hash of the
    normalized text, as near-duplicates of its kept texts, or, with ``embed``, as paraphrases of
    them): question -> where it was seen."""
    from opro.data.dataset import QuestionKey, normalize_question, paraphrase_pairs, question_hash

    seen_hashes: dict[str, str] = {}
    seen_texts: list[tuple[QuestionKey, str, difflib.SequenceMatcher[str]]] = []
    # Every recorded part but held-out: the splits, and the questions a validation could extend into.
    for name in record["questions"]:
        if name == "heldout":
            continue
        for h in record["questions"].get(name) or ():
            seen_hashes.setdefault(str(h), name)
        for t in (record.get("normalized") or {}).get(name) or ():
            key = QuestionKey.of(str(t))  # and a matcher that keeps its index of it: held-out x seen pairs
            seen_texts.append((key, name, difflib.SequenceMatcher(None, "", key.again)))
    moved: dict[str, str] = {}
    for e in dataset.examples_in("heldout"):
        norm = normalize_question(e.query)
        if question_hash(norm) in seen_hashes:
            moved[e.query] = seen_hashes[question_hash(norm)]
        else:
            key = QuestionKey.of(norm)
            near = next((n for t, n, matcher in seen_texts if key.same_as(t, matcher)), None)
            if near is not None:
                moved[e.query] = f"{near}, as a near-duplicate"
    if embed is not None and seen_texts:
        held = [e for e in dataset.examples_in("heldout") if e.query not in moved]
        seen = [(key.normal, name) for key, name, _ in seen_texts]
        for i, j, cos in paraphrase_pairs([normalize_question(e.query) for e in held], [t for t, _ in seen],
                                          embed=embed):
            moved.setdefault(held[i].query, f"{seen[j][1]}, as a paraphrase (cosine {cos:.2f})")
    return moved


def check_heldout(
    dataset: GoldenDataset, *, output_dir: str | Path, other_questions: Mapping[str, Sequence[str]] | None = None,
    embed: Embed | None = None,
) -> str:
    """Both held-out guards: against the record of `opro optimize` in ``output_dir`` (when there is
    one) and against the current split. Returns what the check was made against, for the report."""
    record = load_split_record(output_dir)
    if record is not None:
        check_heldout_against_record(dataset, record=record, where=str(Path(output_dir)), embed=embed)
    check_heldout_leakage(dataset, other_questions=other_questions)
    return LEAKAGE_CURRENT_ONLY if record is None else LEAKAGE_RECORDED


def check_prompt_source(prompt: ResolvedPrompt, *, dataset: GoldenDataset, own_dir: Path,
                        embed: Embed | None = None) -> str:
    """The held-out guard for one compared prompt, from whatever its provenance tells: the run it
    came from (``best``, ``run:DIR``, an exported JSON, a registry version opro tagged), whose recorded
    exemplar, optimization, validation and extension questions must not be held-out here (exactly or
    as near-duplicates). Raises :class:`LeakageError` on an overlap; returns what was checked, or
    ``unchecked: ...`` with why (never "clean" for a prompt whose tuning questions are unknown).

    Whatever its source, a prompt's demonstrations are checked too: a held-out question shown as a
    worked example (with its answer) is refused, exactly or as a near-duplicate."""
    demos = prompt.template.demos
    if demos:
        from opro.data.dataset import normalize_question, question_hash

        norm = [normalize_question(d.query) for d in demos]
        shown = _seen_in_record(dataset, {"questions": {"demonstrations": [question_hash(n) for n in norm]},
                                          "normalized": {"demonstrations": norm}}, embed=embed)
        if shown:
            listed = _first_five([repr(q) for q in shown])
            raise LeakageError(
                f"refusing to call this held-out: prompt {prompt.spec!r} shows {len(shown)} of these held-out "
                f"question(s) as demonstrations, with answers: {listed}. Take its demonstrations from questions "
                "outside the held-out split (opro optimize draws them from the exemplar split)"
            )
    basis = _source_basis(prompt, dataset=dataset, own_dir=own_dir, embed=embed)
    settings = prompt.provenance.get("settings")
    if settings:  # named on the command line (or in the spec): chosen by the user, not tuned here
        basis += "; answered with " + ", ".join(f"{k}={v}" for k, v in settings.items()) + " as named"
    return basis + (f"; its {len(demos)} demonstration(s) are no held-out question" if demos else "")


def _source_basis(prompt: ResolvedPrompt, *, dataset: GoldenDataset, own_dir: Path, embed: Embed | None) -> str:
    if prompt.kind == "initial":
        return "the config's initial instruction: tuned on no question"
    if prompt.run_dir is None:
        return ("unchecked: its provenance names no opro run, so the questions it was tuned on are unknown "
                "(a literal, a plain file, or a registry version opro did not register)")
    run_dir = prompt.run_dir
    if run_dir.resolve() == own_dir.resolve():
        return "this config's own optimization: checked by the split check above"
    if not run_dir.is_dir():
        return f"unchecked: the run it came from ({run_dir}) is not on this machine"
    run = RunDir(run_dir)
    record = run.read_split_record()
    if record is not None:
        parts = ", ".join(k for k in record["questions"] if k != "heldout")
        basis = f"checked against the split recorded by {run_dir} ({parts})"
    else:  # a run from before split records: its current split is the best evidence there is
        from opro.data.dataset import load_dataset, split_record

        ds = load_dataset(run.dataset) if run.has_dataset() else None
        if ds is None or ds.split is None:
            return f"unchecked: {run_dir} has neither a split record nor a split dataset"
        record = split_record(ds)
        basis = f"checked against the current split of {run_dir} (it kept no split record)"
    moved = _seen_in_record(dataset, record, embed=embed)
    if moved:
        listed = _first_five([f"{q!r} (in its {n} split)" for q, n in moved.items()])
        raise LeakageError(
            f"refusing to call this held-out: prompt {prompt.spec!r} comes from the optimization in {run_dir}, "
            f"which saw {len(moved)} of these held-out question(s): {listed}. Compare it on a split that run "
            "never saw (another dataset, or that run's own config)"
        )
    return basis


__all__ = [
    "LEAKAGE_CURRENT_ONLY",
    "LEAKAGE_RECORDED",
    "check_heldout",
    "check_heldout_against_record",
    "check_heldout_leakage",
    "check_prompt_source",
    "load_split_record",
]
