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
from opro.calibration import (
    CALIBRATION_FILE,
    CalibrationItem,
    CalibrationReport,
    CalibrationVerdict,
    auc,
    build_items,
    judge_noise_note,
    load_calibration,
    run_judge,
    summarize,
)
from opro.cli import app
from opro.config import config_from_dict
from opro.dataset import Example
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
        assert server.counts["judge"] == 4 * 3 + 3  # every answer once, one per condition again
        verdicts = tmp_path / "out" / "judge_calibration" / "verdicts.csv"
        # The stored verdicts are answers another judge can be compared on.
        result = runner.invoke(app, ["judge", "agreement", "--answers", str(verdicts), "--judge-b", spec, "--no-cache"])
        assert result.exit_code == 0, result.output
        assert "exact agreement" in result.output and "1.000" in result.output
    summary = (tmp_path / "out" / CALIBRATION_FILE).read_text()
    assert key not in summary and "OPENAI_API_KEY" in summary  # the key's variable, never the key
