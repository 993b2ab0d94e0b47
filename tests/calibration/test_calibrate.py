"""Judge calibration: statistics, the runner on a scripted logit judge, and `opro judge calibrate`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from fakes import experiment_config, judge_reply, write_toml
from typer.testing import CliRunner

import opro.experiment
from opro.calibration.calibrate import (
    CALIBRATION_FILE,
    CalibrationItem,
    CalibrationReport,
    CalibrationVerdict,
    auc,
    build_items,
    calibration_record,
    judge_noise_note,
    load_calibration,
    run_judge,
    summarize,
)
from opro.cli import app
from opro.config import config_from_dict
from opro.data.dataset import Example
from opro.errors import DataError
from opro.judges import CorrectnessJudge
from opro.llm import ChatClient, Message
from opro.llm.cache import CallCache
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM

EXAMPLES = [Example(query=f"Who designed network {i}?", reference_answer=f"Person {i} designed it.") for i in range(4)]


def test_auc_counts_wins_and_half_ties() -> None:
    assert auc([5, 4], [1, 2]) == 1.0
    assert auc([1], [5]) == 0.0
    assert auc([4, 4], [4, 2]) == pytest.approx((0.5 + 1 + 0.5 + 1) / 4)
    assert auc([], [1]) is None


def test_wrong_answers_are_another_questions_reference() -> None:
    items = build_items(EXAMPLES, task_answers=["a", "b", "c", "d"])
    wrong = [i for i in items if i.condition == "wrong"]
    assert [w.answer for w in wrong] == [EXAMPLES[(k + 1) % 4].reference_answer for k in range(4)]
    assert all(w.reference != w.answer for w in wrong)
    assert [i.condition for i in items[:3]] == ["reference", "wrong", "task"]  # grouped by question
    with pytest.raises(DataError, match="at least 2"):
        build_items(EXAMPLES[:1])
    with pytest.raises(DataError, match="3 task answers for 4"):
        build_items(EXAMPLES, task_answers=["a", "b", "c"])


def _verdict(condition: str, q: int, score: float | None, *, repeat: int = 0, cached: bool = False) -> CalibrationVerdict:
    item = CalibrationItem(condition, q, f"q{q}", f"r{q}", "a")
    # A cache hit keeps the latency its call had; a None score (invalid) took no measurable time here.
    return CalibrationVerdict(item, score, None if score is not None else "bad", 2.0 if score else 0.0, cached, repeat)


def test_summary_statistics_from_hand_made_verdicts() -> None:
    verdicts = [
        _verdict("reference", 0, 5.0),
        _verdict("reference", 1, 4.0, cached=True),
        _verdict("wrong", 0, 1.0),
        _verdict("wrong", 1, 4.0),
        _verdict("task", 0, None),
        _verdict("task", 1, 3.0),
        _verdict("reference", 0, 4.0, repeat=1),  # retest: 5 vs 4
        _verdict("wrong", 0, 1.0, repeat=1),  # retest: 1 vs 1
    ]
    report = summarize(verdicts, judge="j", method="m", dataset="d.json", seed=3)
    ref, wrong, task = report.conditions
    assert (ref.mean, wrong.mean, task.mean) == (4.5, 2.5, 3.0)
    assert task.n_invalid == 1 and task.n == 2
    assert ref.distribution == {1: 0, 2: 0, 3: 0, 4: 1, 5: 1}
    assert report.separation == 2.0
    assert report.auc == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert report.invalid_rate == pytest.approx(1 / 6)
    assert report.s_per_call == 2.0 and report.calls == 7 and report.cache_hits == 1
    assert report.retest is not None
    assert report.retest.n == 2 and report.retest.exact == 0.5 and report.retest.within_1 == 1.0
    assert report.retest.sd == pytest.approx(((1.0**2 + 0.0) / 2 / 2) ** 0.5)
    assert report.n_questions == 2 and report.auc_most_likely is None  # no logit judge here
    again = CalibrationReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report


def _logit_judge_llm() -> ScriptedLLM:
    """A judge whose score distribution depends on whether the graded answer is the reference."""

    def probs(messages: tuple[Message, ...], prefix: str) -> Mapping[str, float]:
        text = messages[-1].content
        reference = re.search(r"Reference answer: (.*)", text)
        answer = re.search(r"Answer to grade: (.*)", text)
        assert prefix == '{"score": '
        right = reference is not None and answer is not None and reference.group(1) == answer.group(1)
        return {"5": 0.6, "4": 0.3, "3": 0.05} if right else {"1": 0.7, "2": 0.2, "4": 0.05}

    return ScriptedLLM(choices=probs, model="logit-judge")


def test_run_judge_scores_from_logits_and_retests_without_the_cache(tmp_path: Path) -> None:
    llm = _logit_judge_llm()
    cache = CallCache(tmp_path / "calls.sqlite")
    judge = CorrectnessJudge(ChatClient(llm, role="judge", cache=cache), template="rubric", score_from="auto")
    assert judge.uses_logits
    items = build_items(EXAMPLES)
    verdicts = run_judge(judge, items, retest=2, progress=False)
    assert len(llm.calls) == 8 + 4  # every item once, then 2 per condition again, uncached
    report = summarize(verdicts, judge="logit-judge", method=judge.method, dataset="t", seed=0)
    expected_right = (5 * 0.6 + 4 * 0.3 + 3 * 0.05) / 0.95
    assert report.condition("reference").mean == pytest.approx(expected_right, abs=1e-3)  # type: ignore[union-attr]
    assert report.auc == 1.0 and report.invalid_rate == 0.0
    assert report.auc_most_likely == 1.0
    assert {v.most_likely for v in verdicts if v.item.condition == "reference"} == {5}
    assert {v.most_likely for v in verdicts if v.item.condition == "wrong"} == {1}
    assert report.retest is not None and report.retest.exact == 1.0 and report.retest.sd == 0.0
    # A warm rerun makes no call except the retest repeats, which never use the cache.
    llm.calls.clear()
    again = run_judge(judge, items, retest=0, progress=False)
    assert llm.calls == [] and all(v.cached for v in again)
    cache.close()


@pytest.fixture
def calibrate_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    judge = ScriptedLLM(default=judge_reply, model="judge")
    pool = ModelPool(scripted={"task": ScriptedLLM(default="Using the context: yes.", model="task"), "judge": judge})
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: pool)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")


def test_cli_judge_calibrate_writes_the_report_and_runs_show_it(calibrate_config: Path, tmp_path: Path) -> None:
    cfg = config_from_dict(experiment_config(tmp_path), base_dir=tmp_path, source=str(calibrate_config))
    assert "not measured" in judge_noise_note(cfg) and "opro judge calibrate" in judge_noise_note(cfg)
    runner = CliRunner()
    result = runner.invoke(
        app, ["judge", "calibrate", str(calibrate_config), "--n", "6", "--retest", "2", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "AUC reference vs wrong" in result.output and "test-retest" in result.output
    out = tmp_path / "out"
    report = load_calibration(out)
    assert report is not None and report.n_questions == 6
    # The scripted judge gives 5 to answers mentioning "context": the task answers; 2 to the others.
    assert report.condition("task").mean == 5.0  # type: ignore[union-attr]
    assert report.condition("reference").mean == 2.0 and report.auc == 0.5  # type: ignore[union-attr]
    assert (out / "judge_calibration" / "verdicts.csv").is_file()
    assert (out / "judge_calibration" / "score_distributions.png").stat().st_size > 0
    assert (out / "mlflow.db").is_file()
    note = judge_noise_note(cfg)
    assert "AUC right vs wrong 0.50" in note and "6 questions" in note
    # Other judge settings: the stored calibration no longer applies.
    other = config_from_dict(experiment_config(tmp_path, judge={"template": "fewshot"}), base_dir=tmp_path, source="x.toml")
    assert "other judge settings" in judge_noise_note(other)
    assert CALIBRATION_FILE == "judge_calibration.json"


def test_cli_judge_calibrate_rejects_bad_options(calibrate_config: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["judge", "calibrate", str(calibrate_config), "--conditions", "task", "--no-progress"])
    assert result.exit_code != 0 and "use reference and wrong" in result.output
    result = runner.invoke(app, ["judge", "calibrate", str(calibrate_config), "--score-from", "vibes", "--no-progress"])
    assert result.exit_code == 2 and "reply, logits or auto" in result.output  # a usage error
    result = runner.invoke(
        app, ["judge", "calibrate", str(calibrate_config), "--score-from", "logits", "--no-progress", "--no-mlflow"]
    )
    assert result.exit_code != 0 and "logits" in result.output and "Traceback" not in result.output


def test_calibrate_and_agreement_against_an_openai_compatible_judge(
    calibrate_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fault_server import FaultServer

    key = "sk-calibrate-test-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    runner = CliRunner()
    with FaultServer(key=key) as server:
        spec = f"openai:judge-model@{server.base_url}"
        result = runner.invoke(
            app, ["judge", "calibrate", str(calibrate_config), "--n", "4", "--retest", "1", "--judge", spec,
                  "--no-progress", "--no-mlflow"],
        )
        assert result.exit_code == 0, result.output
        # Every answer once ("Answer i." has a number, no name and one sentence: one near miss each),
        # then one per condition of reference, wrong and task again.
        assert server.counts["judge"] == 4 * 4 + 3
        verdicts = tmp_path / "out" / "judge_calibration" / "verdicts.csv"
        # The stored verdicts are answers another judge can be compared on.
        result = runner.invoke(app, ["judge", "agreement", "--answers", str(verdicts), "--judge-b", spec, "--no-cache"])
        assert result.exit_code == 0, result.output
        assert "exact agreement" in result.output and "1.000" in result.output
    summary = (tmp_path / "out" / CALIBRATION_FILE).read_text()
    assert key not in summary and "OPENAI_API_KEY" in summary  # the key's variable, never the key


# --- near misses ---------------------------------------------------------------------------------

NAMES = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "John McCarthy", "Barbara Liskov", "Donald Knuth"]


def _near_miss_dataset(tmp_path: Path, n: int = 24) -> Path:
    """References with a number, a name and two sentences (and, every fourth, one sentence only)."""
    rows = []
    for i in range(n):
        answer = f"Network {i} was designed by {NAMES[i % len(NAMES)]} in {1990 + i}."
        if i % 4:
            answer += f" It has {i + 5} layers."
        rows.append({"question": f"Who designed network {i}?", "answer": answer})
    path = tmp_path / "near.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _strict_judge(reads_numbers: bool) -> ScriptedLLM:
    """5 when the answer is the reference as far as the judge reads it, else 1: one that reads numbers
    compares only the numbers (and misses a swapped name); one that ignores numbers compares the rest."""

    def reply(messages: tuple[Message, ...], options: object) -> str:
        text = messages[-1].content
        reference = re.search(r"Reference answer: (.*)", text)
        answer = re.search(r"Answer to grade: (.*)", text)
        assert reference is not None and answer is not None
        if reads_numbers:
            same = re.findall(r"\d+", reference.group(1)) == re.findall(r"\d+", answer.group(1))
        else:
            same = re.sub(r"\d+", "#", reference.group(1)) == re.sub(r"\d+", "#", answer.group(1))
        return json.dumps({"score": 5 if same else 1, "reasoning": "scripted"})

    return ScriptedLLM(default=reply, model="strict-judge")


@pytest.mark.parametrize("reads_numbers", [True, False])
def test_near_misses_separate_only_what_the_judge_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_numbers: bool
) -> None:
    pool = ModelPool(scripted={"task": ScriptedLLM(default="Using the context: yes.", model="task"),
                               "judge": _strict_judge(reads_numbers)})
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: pool)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    raw = experiment_config(tmp_path, data={"dataset": str(_near_miss_dataset(tmp_path))},
                            judge={"template": "rubric", "score_from": "reply"})
    config = write_toml(raw, tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["judge", "calibrate", str(config), "--n", "12", "--retest", "1",
                                      "--no-progress", "--no-mlflow"])
    assert result.exit_code == 0, result.output
    report = load_calibration(tmp_path / "out")
    assert report is not None
    number, name, first = (report.contrast(c) for c in ("number", "name", "first-sentence"))
    assert number is not None and name is not None and first is not None
    assert report.condition("number").n == 12 and report.condition("name").n == 12  # type: ignore[union-attr]
    assert report.condition("first-sentence").n == first.pairs == 9  # type: ignore[union-attr]  # 3 of 12 have one sentence
    if reads_numbers:
        assert number.auc == 1.0 and number.win_rate == 1.0 and number.wins == 12 and number.mean_drop == 4.0
        assert name.auc == 0.5 and name.win_rate == 0.5 and name.ties == 12 and name.mean_drop == 0.0
        assert first.auc == 1.0  # the second sentence's number is gone
    else:
        assert number.auc == 0.5 and number.win_rate == 0.5 and number.ties == 12 and number.mean_drop == 0.0
        assert name.auc == 1.0 and name.win_rate == 1.0 and name.mean_drop == 4.0
    assert report.contrast("wrong").auc == report.auc == 1.0  # type: ignore[union-attr]
    assert report.contrast("reference") is None
    text = " ".join(result.output.split())
    assert "the reference against each condition" in text and "first-sentence" in text
    assert f"near miss number (12 of 12 questions have a number in the reference): AUC {number.auc:.3f}" in text
    assert "near miss first-sentence (9 of 12 questions have a reference of two or more sentences)" in text
    # The retest repeats reference, wrong and task only: one each.
    assert report.retest is not None and report.retest.n == 3
    record = calibration_record(report, {})
    assert record.metrics["judge_auc_number"] == number.auc
    assert record.metrics["judge_win_rate_first_sentence"] == first.win_rate
    assert record.metrics["judge_mean_drop_name"] == name.mean_drop and record.metrics["judge_pairs_name"] == 12
    assert record.metrics["judge_mean_first_sentence"] == report.condition("first-sentence").mean  # type: ignore[union-attr]
    cfg = config_from_dict(raw, base_dir=tmp_path, source=str(config))
    assert f"near misses: number AUC {number.auc:.2f}" in judge_noise_note(cfg)


def test_near_miss_statistics_from_hand_made_verdicts() -> None:
    verdicts = [
        _verdict("reference", 0, 5.0), _verdict("reference", 1, 4.0), _verdict("reference", 2, 3.0),
        _verdict("wrong", 0, 1.0), _verdict("wrong", 1, 2.0), _verdict("wrong", 2, 1.0),
        _verdict("name", 0, 3.0), _verdict("name", 1, 4.0), _verdict("name", 2, None),  # a tie, an invalid
    ]
    report = summarize(verdicts, judge="j", method="m", dataset="d", seed=0, requested=("reference", "wrong", "name", "number"))
    name = report.contrast("name")
    assert name is not None
    assert (name.pairs, name.wins, name.ties) == (2, 1, 1)
    assert name.win_rate == 0.75 and name.mean_drop == 1.0
    # The AUC: the references of the questions with a name (5, 4, 3) against the valid names (3, 4).
    assert name.auc == pytest.approx(auc([5.0, 4.0, 3.0], [3.0, 4.0]))
    # A requested near miss that applied nowhere is reported as such.
    number = report.condition("number")
    assert number is not None and number.n == 0 and report.contrast("number").pairs == 0  # type: ignore[union-attr]
    assert "near miss number: 0 of 3 questions have a number in the reference; nothing to compare" in report.lines()
    assert [c.condition for c in report.conditions] == ["reference", "wrong", "number", "name"]
    assert CalibrationReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_calibrations_written_before_the_near_misses_still_load() -> None:
    old = {
        "judge": "qwen", "method": "logits", "dataset": "d.json", "n_questions": 2, "seed": 0,
        "conditions": [
            {"condition": "reference", "n": 2, "n_invalid": 0, "mean": 4.5, "distribution": {"1": 0, "2": 0, "3": 0, "4": 1, "5": 1}},
            {"condition": "wrong", "n": 2, "n_invalid": 0, "mean": 1.5, "distribution": {"1": 1, "2": 1, "3": 0, "4": 0, "5": 0}},
        ],
        "auc": 1.0, "separation": 3.0, "invalid_rate": 0.0, "auc_most_likely": None, "s_per_call": 2.0,
        "calls": 4, "cache_hits": 0, "retest": None, "signature": {}, "created": "2025-01-01T00:00:00+00:00",
    }
    report = CalibrationReport.from_dict(old)
    assert report.contrasts == () and report.contrast("wrong") is None
    assert report.condition("wrong").mean == 1.5  # type: ignore[union-attr]
    assert not any("near miss" in line for line in report.lines()) and "near misses" not in report.summary()
    # A field a later opro adds is left out rather than refused.
    assert CalibrationReport.from_dict({**old, "added_later": [1, 2]}) == report
    with pytest.raises(DataError, match="rerun `opro judge calibrate`"):
        CalibrationReport.from_dict({**old, "contrasts": [{"condition": "name"}]})


def test_build_items_adds_the_near_misses_that_apply() -> None:
    examples = [Example(query="q0", reference_answer="It won in 2012. Alex Krizhevsky built it."),
                Example(query="q1", reference_answer="Dropout helped."),
                Example(query="q2", reference_answer="Geoffrey Hinton advised.")]
    items = build_items(examples, near_miss=("number", "name", "first-sentence"), seed=0)
    by_question = {q: [i.condition for i in items if i.question == q] for q in range(3)}
    assert by_question == {0: ["reference", "wrong", "number", "name", "first-sentence"],
                           1: ["reference", "wrong"], 2: ["reference", "wrong", "name"]}
    name = next(i for i in items if i.question == 0 and i.condition == "name")
    assert name.answer == "It won in 2012. Geoffrey Hinton built it."  # the only other name
    assert all(i.reference == examples[i.question].reference_answer for i in items)
    assert build_items(examples, near_miss=("number",), seed=0) == [i for i in items if i.condition in ("reference", "wrong", "number")]
