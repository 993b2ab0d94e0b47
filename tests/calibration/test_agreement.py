from __future__ import annotations

import json
from pathlib import Path

import pytest

from opro.calibration.agreement import agreement, hamming, load_labels, match_labels, weighted_kappa
from opro.errors import ConfigError, DataError


def test_perfect_agreement() -> None:
    r = agreement([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    assert r.n == 5 and r.exact == 1.0 and r.within_1 == 1.0
    assert r.kappa == pytest.approx(1.0)
    assert r.mean_difference == 0.0


def test_hand_computed_kappa() -> None:
    # a = [1, 2, 3], b = [1, 3, 3] on labels 1..5 (k = 5, weights w_ij = (i-j)^2 / 16).
    # Observed disagreement: one pair (2, 3) with w = 1/16 -> sum w*O = 1/16.
    # Marginals: a = {1:1, 2:1, 3:1}, b = {1:1, 3:2}; expected E_ij = row_i * col_j / 3.
    #   sum w*E = 1/3 * [ (1,1)*0 + (1,3)*2*4/16 + (2,1)*1*1/16 + (2,3)*2*1/16 + (3,1)*1*4/16 + (3,3)*0 ]
    #           = 1/3 * (8 + 1 + 2 + 4) / 16 = 15/48
    # kappa = 1 - (1/16) / (15/48) = 1 - 3/15 = 0.8
    assert weighted_kappa([1, 2, 3], [1, 3, 3]) == pytest.approx(0.8)
    r = agreement([1, 2, 3], [1, 3, 3])
    assert r.kappa == pytest.approx(0.8)
    assert r.exact == pytest.approx(2 / 3)
    assert r.within_1 == 1.0
    assert r.mean_difference == pytest.approx(-1 / 3)
    assert r.distribution_a == {1: 1, 2: 1, 3: 1, 4: 0, 5: 0}
    assert r.distribution_b == {1: 1, 2: 0, 3: 2, 4: 0, 5: 0}


def test_kappa_matches_sklearn() -> None:
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    a = [5, 4, 4, 3, 1, 2, 5, 5, 3, 2, 1, 4]
    b = [4, 4, 5, 3, 2, 2, 5, 3, 3, 1, 1, 5]
    expected = sklearn_metrics.cohen_kappa_score(a, b, weights="quadratic", labels=[1, 2, 3, 4, 5])
    assert weighted_kappa(a, b) == pytest.approx(expected)
    r = agreement(a, b)
    # exact: positions 1,3,5,6,8,10 -> 6/12; within 1: all but index 7 (5 vs 3) -> 11/12
    assert r.exact == pytest.approx(6 / 12)
    assert r.within_1 == pytest.approx(11 / 12)


def test_invalid_pairs_dropped_and_decimals_rounded() -> None:
    r = agreement([4.5, None, 2.0, 3.0], [5, 3, None, 3])
    assert r.n == 2 and r.n_dropped == 2
    assert r.exact == 1.0  # 4.5 rounds to 5
    assert r.mean_difference == pytest.approx(-0.25)


def test_kappa_undefined_when_constant() -> None:
    assert agreement([4, 4], [4, 4]).kappa is None
    assert agreement([], []).exact is None


def test_length_mismatch() -> None:
    with pytest.raises(DataError, match="length"):
        agreement([1, 2], [1])
    with pytest.raises(DataError, match="length"):
        hamming([True], [])


def test_hamming() -> None:
    assert hamming([True, False, True, None], [True, True, True, False]) == 2
    assert hamming([], []) == 0


def test_load_labels_csv_and_json(tmp_path: Path) -> None:
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text('query,human_score\n"What, exactly?",4\nQ2,\n', encoding="utf-8")
    assert load_labels(csv_path) == {"What, exactly?": 4.0, "Q2": None}
    json_path = tmp_path / "labels.json"
    json_path.write_text(json.dumps({"rows": [{"query": "Q", "score": 2}]}), encoding="utf-8")
    assert load_labels(json_path) == {"Q": 2.0}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "Q", "score": 2}]), encoding="utf-8")
    with pytest.raises(DataError, match="'query'"):
        load_labels(bad)
    nan = tmp_path / "nan.csv"
    nan.write_text("query,score\nQ1,nan\nQ2,inf\nQ3,3\n", encoding="utf-8")
    assert load_labels(nan) == {"Q1": None, "Q2": None, "Q3": 3.0}  # "nan" parses as a float, but is no score


def test_labels_match_by_query_and_answer_when_the_file_has_answers(tmp_path: Path) -> None:
    # A calibration's verdicts.csv judges two answers per question: matching by query alone would
    # give both the same label.
    rows = [
        {"query": "Q1", "answer": "right", "reference": "r"},
        {"query": "Q1", "answer": "wrong", "reference": "r"},
        {"query": "Q2", "answer": "other", "reference": "r"},
    ]
    verdicts = tmp_path / "verdicts.csv"
    verdicts.write_text("condition,query,answer,score\nreference,Q1,right,4.2\nwrong,Q1,wrong,1.5\n", encoding="utf-8")
    assert match_labels(rows, verdicts) == [4.2, 1.5, None]
    by_query = tmp_path / "labels.csv"
    by_query.write_text("query,score\nQ1,3\nQ2,5\n", encoding="utf-8")
    assert match_labels(rows, by_query) == [3.0, 3.0, 5.0]
    clash = tmp_path / "clash.csv"
    clash.write_text("query,score\nQ1,3\nQ1,4\n", encoding="utf-8")
    with pytest.raises(DataError, match="two different scores for the same query"):
        match_labels(rows, clash)


def test_load_answers_and_model_spec(tmp_path: Path) -> None:
    from opro.calibration.agreement import load_answers, parse_model_spec

    path = tmp_path / "eval.json"
    path.write_text(
        json.dumps(
            {
                "rows": [
                    {"query": "q1", "answer": "a1", "reference": "r1", "score": 4, "error": None},
                    {
                        "query": "q2",
                        "answer": "",
                        "reference": "r2",
                        "score": None,
                        "error": "LLMServerError: down",
                    },
                ]
            }
        )
    )
    assert load_answers(path) == [{"query": "q1", "answer": "a1", "reference": "r1", "score": 4.0}]
    no_answers = tmp_path / "labels.csv"
    no_answers.write_text("query,reference_answer\nq1,r1\n")
    with pytest.raises(DataError, match=r"labels.csv: row 2: needs 'query', 'answer' and 'reference'"):
        load_answers(no_answers)  # the row as a spreadsheet numbers it (row 1 is the header)
    spec = parse_model_spec("openai:gpt-4o-mini@http://localhost:8000/v1")
    assert (spec.backend, spec.model, spec.base_url) == ("openai", "gpt-4o-mini", "http://localhost:8000/v1")
    assert parse_model_spec("qwen2.5-coder-1.5b-instruct").backend == "llamacpp"
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    assert parse_model_spec(f"llamacpp:{gguf}").model == str(gguf)
    for typo in ("nonsense", "llamacpp:qwen-typo"):  # named with the syntax at once, not when loading fails
        with pytest.raises(ConfigError, match=r"neither an embedded model .* write llamacpp:NAME_OR_GGUF, openai:MODEL"):
            parse_model_spec(typo)


def test_cli_agreement_with_labels(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from opro.cli import app
    from opro.evaluation.batch import EvaluationReport, EvaluationRow

    rows = tuple(
        EvaluationRow(query=f"q{i}", reference="r", answer="a", score=s, passing=s >= 4)
        for i, s in enumerate([5.0, 4.0, 2.0, 1.0])
    )
    answers = EvaluationReport(rows=rows).to_csv(tmp_path / "eval.csv")
    labels = tmp_path / "labels.csv"
    labels.write_text("query,score\nq0,5\nq1,3\nq2,2\nq3,1\n")
    result = CliRunner().invoke(
        app, ["judge", "agreement", "--answers", str(answers), "--labels", str(labels)]
    )
    assert result.exit_code == 0, result.output
    assert "exact agreement" in result.output and "0.750" in result.output
    assert "within 1 point" in result.output and "1.000" in result.output
    both = CliRunner().invoke(app, ["judge", "agreement", "--answers", str(answers)])
    assert both.exit_code == 2
    for spec, named in (("nonsense", "judge spec 'nonsense' is neither"), ("mlflow:nonsense", "(after mlflow:)")):
        typo = CliRunner().invoke(app, ["judge", "agreement", "--answers", str(answers), "--judge-b", spec])
        assert typo.exit_code == 2 and named in " ".join(typo.output.split()), typo.output
    bad_source = CliRunner().invoke(
        app, ["judge", "agreement", "--answers", str(answers), "--judge-b", "nonsense", "--score-from-b", "vibes"]
    )
    assert bad_source.exit_code == 2 and "must be reply, logits or auto, got 'vibes'" in bad_source.output
