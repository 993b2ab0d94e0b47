"""experiments/cluster_correlation.py: the within-cluster correlation of paired differences from the
side-by-side judge's per-question file, and a clear line where the file is not there yet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cluster_correlation import main, side_by_side


def _write(path: Path, *, shared: float, clusters: int = 300, seed: int = 0) -> None:
    """Clusters of two questions on one passage, whose pointwise differences share ``shared`` of their
    variance; the side-by-side differences are independent."""
    rng = np.random.default_rng(seed)
    questions = []
    for c in range(clusters):
        common = rng.normal(0, np.sqrt(shared))
        for q in range(2):
            d = common + rng.normal(0, np.sqrt(1 - shared))
            questions.append({"query": f"q{c}-{q}?", "reference_contexts": [f"Passage {c}."],
                              "pointwise": [3.0 + d, 3.0], "side_by_side": [3.0 + rng.normal(), 3.0]})
    path.write_text(json.dumps({"questions": questions}), encoding="utf-8")


def test_the_correlation_of_each_judge_mode_is_measured_by_passage(tmp_path: Path) -> None:
    path = tmp_path / "side_by_side_alexnet.json"
    _write(path, shared=0.5)
    pointwise, paired = side_by_side(path)
    assert pointwise["clusters"] == 300 and pointwise["questions"] == 600
    assert pointwise["icc"] == pytest.approx(0.5, abs=0.12)
    assert abs(paired["icc"]) < 0.15


def test_a_missing_file_is_said_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = tmp_path / "rag_dataset.json"
    dataset.write_text(json.dumps({"examples": [{"query": "a?", "reference_contexts": ["P"]},
                                                {"query": "b?", "reference_contexts": ["p"]},
                                                {"query": "c?", "reference_contexts": []}]}), encoding="utf-8")
    assert main(["--side-by-side", str(tmp_path / "absent.json"), "--dataset", str(dataset)]) == 0
    out = capsys.readouterr().out
    assert "absent.json: not there yet" in out
    assert "3 questions in 2 clusters (1 of 1, 1 of 2)" in out


def test_a_run_folders_validation_answers_are_paired_by_question(tmp_path: Path) -> None:
    """Two validation prompts' kept answers (validation_rows/*.part.json) give one ICC on the questions both
    answered; a file of a few selection questions pairs with nothing."""
    from cluster_correlation import validation_rows

    rng = np.random.default_rng(1)
    rows = tmp_path / "validation_rows"
    rows.mkdir()
    contexts, a, b = {}, [], []
    for c in range(200):
        common = rng.normal(0, np.sqrt(0.6))
        for q in range(2):
            query = f"q{c}-{q}?"
            contexts[query] = (f"Passage {c}.",)
            a.append({"query": query, "score": 3.0 + common + rng.normal(0, np.sqrt(0.4))})
            b.append({"query": query, "score": 3.0})
    b[0]["score"] = None  # an unscored answer is left out of the pairs
    (rows / "aaaa.part.json").write_text(json.dumps(a), encoding="utf-8")
    (rows / "bbbb.part.json").write_text(json.dumps(b), encoding="utf-8")
    (rows / "cccc.part.json").write_text(json.dumps(a[:4]), encoding="utf-8")
    (row,) = validation_rows(tmp_path, contexts)
    assert row["source"] == "validation: aaaa - bbbb" and row["questions"] == 399
    assert row["icc"] == pytest.approx(0.6, abs=0.12)


def test_a_finished_validation_stage_is_paired_from_its_study(tmp_path: Path) -> None:
    """Once the stage has finished (its answers gone to MLflow), the scores the study keeps per batch are put
    back on their questions through the newest decision's question hashes; the initial and the finalist
    are labelled from summary.json, pointwise and side by side, and the two modes are never paired."""
    import optuna
    from cluster_correlation import validation_study

    from opro.data.dataset import question_hashes
    from opro.search.paired import _key as side_key
    from opro.search.study import _Key

    rng = np.random.default_rng(2)
    contexts, queries = {}, []
    for c in range(100):
        for q in range(2):
            queries.append(f"q{c}-{q}?")
            contexts[queries[-1]] = (f"Passage {c}.",)
    initial, finalist = "Answer the query.", "Answer the query. {top_k=1}"
    common = np.repeat(rng.normal(0, np.sqrt(0.5), 100), 2)
    pointwise = 3.0 + common + rng.normal(0, np.sqrt(0.5), 200)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="s")
    study.set_user_attr("validation_decisions", [{"questions": list(question_hashes(queries))}])
    for start, stop in ((0, 4), (4, 120), (120, 200)):  # batches: selection, confirmation, extension
        batch = queries[start:stop]
        study.set_user_attr(_Key.validation(initial, batch), [3.0] * len(batch))
        study.set_user_attr(_Key.validation(finalist, batch), list(pointwise[start:stop]))
        study.set_user_attr(_Key.validation(side_key(initial, finalist, 0), batch), [3.0] * len(batch))
        study.set_user_attr(_Key.validation(side_key(initial, finalist, 1), batch),
                            [3.0 + d for d in rng.normal(0, 0.5, stop - start)])
    (tmp_path / "summary.json").write_text(json.dumps({
        "initial_instruction": initial, "validation": {"finalists": [{"instruction": finalist}]}}), encoding="utf-8")
    rows = {r["source"]: r for r in validation_study(tmp_path, contexts)}
    assert set(rows) == {"validation (s): finalist 1 (pointwise) - initial (pointwise)",
                         "validation (s): finalist 1 (side by side with initial) - initial (side by side with finalist 1)"}
    point = rows["validation (s): finalist 1 (pointwise) - initial (pointwise)"]
    assert point["questions"] == 200 and point["shared"] == 100
    assert point["icc"] == pytest.approx(0.5, abs=0.2)
    assert abs(rows["validation (s): finalist 1 (side by side with initial) - initial (side by side with finalist 1)"]
               ["icc"]) < 0.25
