"""How much do the paired differences of questions on the same source passage move together?

Issue 67, item 4: questions generated from one passage share it as their reference context, and the
paired tests count such a cluster once (:mod:`opro.stats.clusters`). This script measures the
within-cluster correlation (ICC(1), :func:`opro.stats.clusters.within_correlation`) of paired
differences, clusters from each question's first reference context, from:

- ``--side-by-side FILE`` (default ``experiments/results/side_by_side_alexnet.json``): per question,
  ``{"query", "reference_contexts", "pointwise": [score_a, score_b], "side_by_side": [score_a, score_b]}``
  under ``"questions"`` (the side-by-side judge's measurement on history_of_alexnet); the ICC of a - b
  for either judge mode;
- ``--run DIR`` (repeatable): an opro run folder's comparisons (``compare/*/report.json``: the held-out
  questions and each prompt's scores, each prompt against the baseline), clusters from the folder's
  saved dataset (``dataset/``), and the validation stage's answers while the folder still holds them
  (``validation_rows/*.part.json``, kept until MLflow has them: a running or interrupted stage), else its
  scores as the study keeps them (``optuna.db``: each prompt's scores per batch of questions, the batches
  found among the questions of the newest validation decision): every two prompts' scores on the
  questions both answered (under the side-by-side judge, each prompt's side-by-side scores);
- ``--dataset FILE`` (repeatable; default history_of_alexnet's rag_dataset.json under ../shared/data):
  how many clusters a dataset holds and their sizes.

    python experiments/cluster_correlation.py --run outputs/models_alexnet

With few clusters of two the ICC is noisy: its standard error is printed beside it (a normal
approximation, ``(1 - r)^2 (1 + r)^2 / (k - 1)`` per cluster of two, Fisher 1925).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opro.stats.clusters import cluster_keys, within_correlation

HERE = Path(__file__).resolve().parent
SIDE_BY_SIDE = HERE / "results" / "side_by_side_alexnet.json"
#: The fewest clusters of two or more questions an ICC is given from.
MIN_SHARED = 5
ALEXNET = HERE.parent.parent / "shared" / "data" / "history_of_alexnet" / "rag_dataset.json"


def icc_row(source: str, differences: Sequence[float], contexts: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The ICC of ``differences`` clustered by their questions' first reference context."""
    keys = cluster_keys(contexts)
    sizes = Counter(keys)
    shared = [k for k, m in sizes.items() if m > 1]
    # Only clusters of two or more questions say how alike a cluster's questions are: with fewer than
    # MIN_SHARED of them the figure is noise, and none is given.
    r = within_correlation(list(differences), keys) if len(shared) >= MIN_SHARED else math.nan
    k = len(sizes)
    se = (1 - r) * (1 + r) / math.sqrt(len(shared) - 1) if not math.isnan(r) else math.nan
    sd = statistics.stdev(differences) if len(differences) > 1 else math.nan
    return {"source": source, "questions": len(keys), "clusters": k, "shared": len(shared),
            "icc": r, "se": se, "sd": sd}


def side_by_side(path: Path) -> list[dict[str, Any]]:
    """The ICC of both judge modes' paired differences in a side-by-side file (none if it is missing)."""
    if not path.is_file():
        print(f"{path}: not there yet (the side-by-side judge's run on history_of_alexnet writes it); skipped")
        return []
    questions = json.loads(path.read_text(encoding="utf-8"))["questions"]
    contexts = [q.get("reference_contexts") or () for q in questions]
    return [icc_row(f"{path.name}: {mode}", [float(q[mode][0]) - float(q[mode][1]) for q in questions], contexts)
            for mode in ("pointwise", "side_by_side")]


def run_folder(folder: Path) -> list[dict[str, Any]]:
    """The ICC of every comparison in a run folder, each prompt against the baseline."""
    from opro.data.dataset import GoldenDataset

    dataset = folder / "dataset"
    if not dataset.is_dir():
        print(f"{folder}: no saved dataset (dataset/): not an opro run folder; skipped")
        return []
    contexts_of = {e.query: e.reference_contexts for e in GoldenDataset.load(dataset).examples}
    rows = []
    for report in sorted((folder / "compare").glob("*/report.json")):
        data = json.loads(report.read_text(encoding="utf-8"))
        base = next(p for p in data["prompts"] if p["label"] == data["baseline"])
        for p in data["prompts"]:
            if p is base:
                continue
            kept = [(q, a - b) for q, a, b in zip(data["questions"], p["scores"], base["scores"], strict=True)
                    if a is not None and b is not None]
            rows.append(icc_row(f"{report.parent.name}: {p['label']} - {base['label']}", [d for _, d in kept],
                                [contexts_of.get(q, ()) for q, _ in kept]))
    kept = validation_rows(folder, contexts_of)
    rows += kept or validation_study(folder, contexts_of)
    if not rows:
        print(f"{folder}: no comparisons (compare/*/report.json) or validation answers; run `opro compare` there first")
    return rows


def validation_rows(folder: Path, contexts_of: dict[str, Any]) -> list[dict[str, Any]]:
    """The ICC of every two validation prompts' paired differences on the questions both answered (at least
    10: the 4 selection questions alone say nothing), from the stage's files kept in the folder."""
    kept = {path.name.removesuffix(".part.json"): {r["query"]: r["score"] for r in json.loads(path.read_text("utf-8"))
                                                   if r.get("score") is not None}
            for path in sorted((folder / "validation_rows").glob("*.part.json"))}
    return paired_rows("validation", kept, contexts_of, {})


def paired_rows(source: str, scores: dict[str, dict[str, float]], contexts_of: dict[str, Any],
                label: dict[str, tuple[str, str | None]]) -> list[dict[str, Any]]:
    """The ICC of every two prompts' paired differences on the questions both answered (at least 10: the 4
    selection questions alone say nothing), named by ``label`` (key -> name, judge mode) where it has them,
    in the labels' order; two prompts of different judge modes are not paired (such a difference measures
    nothing)."""
    def name(key: str) -> str:
        return label[key][0] if key in label else key

    rows = []
    names = sorted(scores, key=name)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = [q for q in scores[a] if q in scores[b]]
            if len(both) >= 10 and label.get(a, (a, None))[1] == label.get(b, (b, None))[1]:
                rows.append(icc_row(f"{source}: {name(a)} - {name(b)}", [scores[a][q] - scores[b][q] for q in both],
                                    [contexts_of.get(q, ()) for q in both]))
    return rows


def validation_study(folder: Path, contexts_of: dict[str, Any]) -> list[dict[str, Any]]:
    """As :func:`validation_rows`, from the folder's study: each prompt's validation scores per batch
    (``validation:PROMPT:BATCH``, the batch keyed by its questions), placed on the questions of the newest
    validation decision it holds (their ledger hashes, in the order asked), the batch being the run of
    them whose key it is."""
    import optuna

    from opro.data.dataset import question_hashes
    from opro.search.study import questions_key

    if not (folder / "optuna.db").is_file():
        return []
    by_hash = {h: q for q, h in zip(contexts_of, question_hashes(contexts_of), strict=True)}
    label = _labels(folder)
    rows = []
    for summary in optuna.get_all_study_summaries(f"sqlite:///{folder / 'optuna.db'}", include_best_trial=False):
        attrs = summary.user_attrs
        if not attrs.get("validation_decisions"):
            continue
        asked = [by_hash.get(h, "") for h in attrs["validation_decisions"][-1]["questions"]]
        scores: dict[str, dict[str, float]] = {}
        for key, values in attrs.items():
            if not key.startswith("validation:"):
                continue
            _, prompt, batch = key.split(":")
            n = len(values)
            start = next((s for s in range(len(asked) - n + 1) if questions_key(asked[s:s + n]) == batch), None)
            if start is not None:
                scores.setdefault(prompt, {}).update(
                    (q, v) for q, v in zip(asked[start:start + n], values, strict=True) if v is not None)
        rows += paired_rows(f"validation ({summary.study_name})", scores, contexts_of, label)
    return rows


def _labels(folder: Path) -> dict[str, tuple[str, str | None]]:
    """The study's prompt keys of the run's initial configuration and finalists (summary.json), each with a
    label and its judge mode: their pointwise scores, and each pair's side-by-side scores."""
    from opro.search.paired import _key as side_key
    from opro.search.study import _prompt_key

    path = folder / "summary.json"
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text(encoding="utf-8"))
    finalists = [f["instruction"] for f in (summary.get("validation") or {}).get("finalists", [])]
    named = {summary["initial_instruction"]: "initial", **{f: f"finalist {i}" for i, f in enumerate(finalists, 1)}}
    labels: dict[str, tuple[str, str | None]] = {_prompt_key(n): (f"{s} (pointwise)", "pointwise")
                                                 for n, s in named.items()}
    for a, sa in named.items():
        for b, sb in named.items():
            for w, s in ((0, sa), (1, sb)):
                if a != b:
                    labels[_prompt_key(side_key(a, b, w))] = (f"{s} (side by side with {sb if w == 0 else sa})",
                                                              "side by side")
    return labels


def layout(path: Path) -> dict[str, Any] | None:
    """A dataset's clusters: how many, and how many questions each holds."""
    if not path.is_file():
        print(f"{path}: no such dataset; skipped")
        return None
    examples = json.loads(path.read_text(encoding="utf-8"))["examples"]
    sizes = Counter(cluster_keys([e.get("reference_contexts") or () for e in examples]))
    return {"dataset": str(path), "questions": len(examples), "clusters": len(sizes),
            "sizes": dict(sorted(Counter(sizes.values()).items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side-by-side", type=Path, default=SIDE_BY_SIDE)
    ap.add_argument("--run", type=Path, action="append", default=[], help="an opro run folder (repeatable)")
    ap.add_argument("--dataset", type=Path, action="append", help="a rag_dataset.json (repeatable)")
    args = ap.parse_args(argv)
    for path in args.dataset or [ALEXNET]:
        if (found := layout(path)) is not None:
            sizes = ", ".join(f"{n} of {m}" for m, n in found["sizes"].items())
            print(f"{found['dataset']}: {found['questions']} questions in {found['clusters']} clusters ({sizes})")
    rows = side_by_side(args.side_by_side) + [r for folder in args.run for r in run_folder(folder)]
    if rows:
        print("| paired differences | questions | clusters (of 2 or more) | paired sd | within-cluster correlation ± se |")
        print("|---|---|---|---|---|")
        for r in rows:
            icc = "-" if math.isnan(r["icc"]) else f"{r['icc']:+.2f} ± {r['se']:.2f}"
            print(f"| {r['source']} | {r['questions']} | {r['clusters']} ({r['shared']}) | {r['sd']:.2f} | {icc} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
