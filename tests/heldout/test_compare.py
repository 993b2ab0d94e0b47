"""Prompt comparison on scripted models: paired statistics, leakage refusal, reports, MLflow, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import optimized, scripted_pool
from typer.testing import CliRunner

from opro.errors import ConfigError, DataError
from opro.experiment import Experiment
from opro.export.sources import resolve_prompt
from opro.heldout.compare import compare_prompts, save_comparison
from opro.llm.scripted import ScriptedLLM


@pytest.fixture(scope="module")
def run_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return optimized(tmp_path_factory.mktemp("run"))


def test_best_vs_initial_on_heldout(run_config: Path) -> None:
    exp = Experiment.from_file(run_config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"], extra_metrics=["token_f1"])
        saved = save_comparison(report, experiment=exp, name="first")
    finally:
        exp.close()
    assert report.split == "heldout" and report.leakage_checked
    assert len(report.questions) == 10
    initial, best = report.prompts
    assert initial.mean is not None and initial.mean.estimate == 2.0 and initial.pass_rate == 0.0
    assert best.mean is not None and best.mean.estimate == 5.0 and best.pass_rate == 1.0
    assert "context" in best.instruction.lower()
    assert report.versus[0] is None
    v = report.versus[1]
    assert v is not None
    assert (v.stats.win_tie_loss.wins, v.stats.win_tie_loss.ties, v.stats.win_tie_loss.losses) == (10, 0, 0)
    assert v.stats.difference.estimate == 3.0
    # 10 differences of +3: the betting test (bets tuned to 10 pairs) p = 0.0117; Wilcoxon (tied ranks) approximate.
    assert v.stats.test.name == "betting" and v.stats.test.p_value == pytest.approx(0.01172, abs=1e-4)
    assert v.stats.wilcoxon.p_value < 0.01
    assert "significant at 0.05" in v.sentence and "not significant" not in v.sentence
    assert set(best.metric_means) == {"token_f1"}

    out = run_config.parent / "out" / "compare" / "first"
    assert saved.directory == out
    assert {p.name for p in out.iterdir()} == {"report.md", "report.json", "scores.csv", "comparison.png", "optimism.png"}
    assert (out / "optimism.png").stat().st_size > 1000  # search vs validation vs held-out, per prompt
    data = json.loads((out / "report.json").read_text())
    assert data["prompts"][1]["versus_baseline"]["wins"] == 10
    assert data["baseline"] == "initial"
    md = (out / "report.md").read_text()
    assert "held-out" in md and "significant at 0.05" in md and "Leakage check" in md

    from mlflow import MlflowClient

    uri = f"sqlite:///{run_config.parent / 'out' / 'mlflow.db'}"
    run = MlflowClient(tracking_uri=uri).get_run(saved.recorded[0].ref)
    assert run.data.tags["opro.kind"] == "comparison"
    assert run.data.metrics["prompt_1.mean"] == 5.0
    assert run.data.metrics["prompt_1.betting_p"] == pytest.approx(0.01172, abs=1e-4)
    assert run.data.params["prompt_0.spec"] == "initial"
    assert "optimizer.steps" not in run.data.params
    artifacts = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run.info.run_id)}
    assert {"report.md", "report.json", "comparison.png"} <= artifacts


def test_identical_configurations_are_said_to_be_identical(run_config: Path) -> None:
    """Issue 57, item 4: the same configuration twice (here the initial instruction as a literal, and
    as initial with the config's own top_k named) is said to be the same, never "+0.00 [+0.00, +0.00]"
    or "0% fewer [-0%, -0% fewer]"."""
    exp = Experiment.from_file(run_config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "text:Answer the question.", "initial {top_k=2}",
                                                          "initial {top_k=1}"], n_resamples=1000, margin=0.25)
    finally:
        exp.close()
    same, named, other = report.versus[1:]
    assert same is not None and named is not None and other is not None
    assert same.identical and named.identical and not other.identical
    assert same.stats.wilcoxon.p_value == 1.0 and same.stats.test.p_value == 1.0
    assert "the same configuration" in same.sentence and "not significant" not in same.sentence
    cells = report._cells()
    assert cells[1]["diff"] == cells[1]["d_cost"] == cells[1]["d_tokens"] == cells[1]["noninferiority"] == "identical"
    for v in (same, named):  # no interval, no share of anything
        assert "[" not in v.sentence and "%" not in v.sentence and "0.00" not in v.sentence
    rows = report.to_markdown().split("## Verdict")[1]
    assert rows.count("the same configuration") == 2


def test_prompt_specs_and_their_errors(run_config: Path, tmp_path: Path) -> None:
    from opro.config import load_config

    cfg = load_config(run_config)
    assert resolve_prompt("initial", config=cfg).instruction == "Answer the question."
    best = resolve_prompt("best", config=cfg)
    assert best.kind == "run" and best.provenance["score"] == 5.0
    assert resolve_prompt(f"run:{run_config}").template == best.template
    assert resolve_prompt(f"run:{cfg.output_dir}").template == best.template
    assert resolve_prompt(str(run_config)).template == best.template
    full = tmp_path / "full.txt"
    full.write_text(best.template_text)
    assert resolve_prompt(str(full)).template == best.template
    plain = tmp_path / "plain.txt"
    plain.write_text("Answer in one word.\n")
    assert resolve_prompt(f"file:{plain}").instruction == "Answer in one word."
    assert resolve_prompt("Answer in one word.").kind == "literal"
    registered = resolve_prompt("prompts:/qa-t@latest-best", config=cfg)
    assert registered.template.template_text == best.template_text

    with pytest.raises(ConfigError, match="pass its config"):
        resolve_prompt("best")
    with pytest.raises(DataError, match=r"no such file \(for a literal instruction write text:"):
        resolve_prompt("missing/prompt.txt")
    with pytest.raises(DataError, match=r"no summary\.json"):
        resolve_prompt(f"run:{tmp_path}")
    with pytest.raises(ConfigError, match=r"is a directory; .*run:"):
        resolve_prompt(str(tmp_path))
    with pytest.raises(ConfigError, match="cannot load prompt"):
        resolve_prompt("prompts:/nope@production", config=cfg)
    with pytest.raises(ConfigError, match="prompts:/NAME@ALIAS"):
        resolve_prompt("prompts:/bad name", config=cfg)
    with pytest.raises(ConfigError, match="1 initial instruction"):
        resolve_prompt("initial:3", config=cfg)


def test_compare_argument_errors(run_config: Path) -> None:
    exp = Experiment.from_file(run_config, pool=scripted_pool(), progress=False)
    try:
        with pytest.raises(ConfigError, match="at least two prompts"):
            compare_prompts(experiment=exp, prompts=["best"])
        with pytest.raises(ConfigError, match="baseline 'x' is not one of"):
            compare_prompts(experiment=exp, prompts=["best", "initial"], baseline="x")
        with pytest.raises(ConfigError, match="unknown extra metric 'bleu'"):
            compare_prompts(experiment=exp, prompts=["best", "initial"], extra_metrics=["bleu"])
        with pytest.raises(ConfigError, match="split 'test'"):
            compare_prompts(experiment=exp, prompts=["best", "initial"], split="test")
    finally:
        exp.close()


def test_cli_compare_defaults_to_best_vs_initial(run_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opro.cli import app

    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    monkeypatch.setenv("COLUMNS", "240")
    result = CliRunner().invoke(app, ["compare", str(run_config), "--name", "cli", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "initial (baseline)" in result.output and "significant at 0.05" in result.output
    assert (run_config.parent / "out" / "compare" / "cli" / "report.json").is_file()
    assert "recorded: MLflow run " in result.output  # where the recorder says it recorded
    bad = CliRunner().invoke(app, ["compare", str(run_config), "--prompt", "nothere.txt", "--no-mlflow"])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_compare_names_settings_and_checks_them_like_any_source(run_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 57, item 4: --set answers the --prompt with those settings, validated through the table of
    dimensions; the held-out guard checks it as it checks its source; the cost is the search's measure."""
    from narrow import invoke_narrow

    from opro.cli import app

    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    result = invoke_narrow(["compare", str(run_config), "--prompt", "initial", "--set", "top_k=1", "--set",
                            "answer_max_tokens=48", "--name", "set", "--no-mlflow", "--no-progress"], monkeypatch,
                           min_tables=3)
    assert result.exit_code == 0, result.output
    report = json.loads((run_config.parent / "out" / "compare" / "set" / "report.json").read_text())
    initial, configured = report["prompts"]
    assert (initial["label"], configured["label"]) == ("initial", "initial {top_k=1, answer_max_tokens=48}")
    assert configured["settings"] == {"top_k": 1, "answer_max_tokens": 48} and configured["kind"] == "initial"
    guard = report["leakage_by_prompt"][configured["label"]]
    assert not guard.startswith("unchecked") and "tuned on no question" in guard and "top_k=1" in guard
    assert report["cost_measure"] == "weighted task tokens (prompt + 4 x completion)"
    said = " ".join(result.output.split())
    assert "cost per answer: weighted task tokens (prompt + 4 x completion)" in said
    assert "tokens and seconds per answer" in said
    assert configured["versus_baseline"]["cost_difference"]["cost"]["n"] == len(report["questions"])
    assert not configured["versus_baseline"]["identical"]
    # Values are checked through the table: each error names the value and what is allowed.
    for setting, message in (("top_k=abc", "top_k = 'abc' must be an integer >= 1"),
                             ("top_k=0", "top_k = '0' must be a positive integer"),
                             ("retriever=sparse", "retriever = 'sparse' must be one of 'bm25', 'dense', 'hybrid'"),
                             ("rerank=1", "no search dimension 'rerank'; the dimensions: demos, top_k"),
                             ("top_k", "write NAME=VALUE"),
                             ("demos=1", "demos cannot be set on a prompt")):
        bad = CliRunner().invoke(app, ["compare", str(run_config), "--prompt", "initial", "--set", setting,
                                       "--no-mlflow", "--no-progress"])
        assert bad.exit_code == 2 and message in " ".join(bad.output.split()), (setting, bad.output)
    # A prompt source may carry its settings itself.
    from opro.config import load_config

    cfg = load_config(run_config)
    best = resolve_prompt("best {top_k=1}", config=cfg)
    assert best.kind == "run" and best.template.setting("top_k") == 1 and best.label == "best {top_k=1}"
    assert best.provenance["settings"] == {"top_k": 1} and best.run_dir is not None
    # Braces that name no setting are part of a literal instruction, as they always were.
    assert resolve_prompt('text:Reply as {"answer": "..."}', config=cfg).template.settings == {}


def test_compare_reads_set_once_and_never_reparses_a_prompt_it_wrote(run_config: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 69, item 3: --set is read into the configuration once; compare never writes it back into a
    prompt's text to parse it again (text -> value -> text -> value)."""
    from opro.heldout.compare import ComparisonSettings
    from opro.program.configurations import Configuration
    from opro.workflows.compare import compare_and_save

    parsed: list[str] = []
    parse = Configuration.parse.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Configuration, "parse",
                        classmethod(lambda cls, text, **kw: (parsed.append(text), parse(cls, text, **kw))[1]))
    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    asked = ComparisonSettings(prompts=("initial {top_k=2}",), settings={"answer_max_tokens": 48}, name="once",
                               mlflow=False)
    done = compare_and_save(run_config, asked, progress=False)
    assert [p.label for p in done.report.prompts] == ["initial", "initial {top_k=2, answer_max_tokens=48}"]
    assert done.report.prompts[1].settings == {"top_k": 2, "answer_max_tokens": 48}
    assert not [t for t in parsed if "answer_max_tokens" in t], parsed  # the --set value never as text


def test_cli_compare_reads_at_80_columns_in_a_log(run_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52, item 9: compare's one table had 14 columns (one word, or three letters, per line at 80).
    Now a quality table, a cost table and an extra-metrics one, numbered rows, the prompts listed whole."""
    from narrow import invoke_narrow

    long = ("Answer from the context in one or two plain sentences, quoting the passage that supports the answer, "
            "and say that you do not know when the context is silent.")
    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    result = invoke_narrow(["compare", str(run_config), "--prompt", "best", "--prompt", f"text:{long}",
                            "--metrics", "token_f1", "--margin", "0.25", "--name", "narrow", "--no-mlflow",
                            "--no-progress"], monkeypatch, min_tables=3)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "#1 initial (baseline): Answer the question." in said and f"#3 {long}" in said
    assert not [line for line in result.output.splitlines() if "│" in line and "quoting" in line]  # not in a grid
    for figure in ("[1.77, 2.23]", "[+0.68, +4.00]", "10/0/0", "(0.00391)", "(10/10)", "(margin 0.25)", "token_f1"):
        assert figure in said, figure  # a cell of each table, an interval under its estimate
    report = json.loads((run_config.parent / "out" / "compare" / "narrow" / "report.json").read_text())
    assert [p["label"] for p in report["prompts"]][:2] == ["initial", "best"]


def test_a_comparison_records_through_the_recorders_it_is_given(run_config: Path, tmp_path: Path) -> None:
    """The recording seam: a comparison is one CommandRecord (what MLflow gets), recorded by whatever
    recorders it is handed; none given and --no-mlflow: recorded nowhere, the files still written."""
    from opro.heldout.compare import comparison_record
    from opro.search.records import CommandRecord, Recorded

    class Keep:
        name = "keep"

        def __init__(self) -> None:
            self.records: list[CommandRecord] = []

        def record(self, record: CommandRecord) -> Recorded:
            self.records.append(record)
            return Recorded(recorder=self.name, ref="1", where="in memory")

    keep = Keep()
    exp = Experiment.from_file(run_config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"], n_resamples=1000)
        saved = save_comparison(report, experiment=exp, directory=tmp_path / "kept", recorders=[keep])
        quiet = save_comparison(report, experiment=exp, directory=tmp_path / "quiet", mlflow=False)
        params = {k: v for k, v in exp.run_params().items() if not k.startswith("optimizer.")}
    finally:
        exp.close()
    assert saved.recorded == (Recorded("keep", "1", "in memory"),) and quiet.recorded == ()
    assert (tmp_path / "quiet" / "report.json").is_file()
    (record,) = keep.records
    assert record == comparison_record(report, tmp_path / "kept", params=params)
    assert (record.kind, record.name, dict(record.files)) == ("comparison", "compare kept", {tmp_path / "kept": None})
    assert record.tags == {"opro.split": "heldout", "opro.baseline": "initial"}
    assert record.params["compare.baseline"] == "initial" and record.params["prompt_1.spec"] == "best"
    assert record.metrics["prompt_1.wins"] == 10 and record.metrics["prompt_0.n_invalid"] == 0


def test_unreadable_verdicts_of_an_extra_metric_are_counted(run_config: Path, tmp_path: Path) -> None:
    """Issue 40, item 7: a yes/no judge whose replies cannot be read showed "n/a" with no count."""
    exp = Experiment.from_file(run_config, pool=scripted_pool(), progress=False)
    try:  # the scripted judge answers JSON scores, never YES/NO: every faithfulness verdict is unreadable
        report = compare_prompts(experiment=exp, prompts=["initial", "best"], extra_metrics=["faithfulness"],
                                 n_resamples=1000)
    finally:
        exp.close()
    assert all(p.metric_invalid == {"faithfulness": 10} and p.metric_means["faithfulness"] is None for p in report.prompts)
    report.write(tmp_path / "rep")
    assert "n/a (10 invalid)" in (tmp_path / "rep" / "report.md").read_text()
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["prompts"][0]["metric_invalid"] == {"faithfulness": 10}


def test_a_compared_prompt_is_never_decoded_in_a_batch_with_another(tmp_path: Path) -> None:
    """Issue 40, item 9: an embedded model's batched answers can part from lone ones on long answers
    (experiments/bench_batch_text.py: 7 of 30), so a prompt's held-out score moved with the prompts
    compared beside it. compare decodes every answer alone: one fixed layout, whatever is compared."""
    from collections.abc import Sequence as Seq

    from fakes import judge_reply, task_reply

    from opro.llm import Completion, GenerationOptions, Message
    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    class Batching(ScriptedLLM):
        supports_batch = True
        max_concurrency = 1
        batch_width = 4

        def __init__(self) -> None:
            super().__init__(default=task_reply, model="task")
            self.batches: list[int] = []

        def generate_many(self, calls: Seq[tuple[tuple[Message, ...], GenerationOptions]]) -> list[Completion]:
            self.batches.append(len(calls))
            return super().generate_many(calls)  # type: ignore[return-value]

    config = optimized(tmp_path)  # its held-out questions were never answered: every call is real
    task, judge = Batching(), ScriptedLLM(default=judge_reply, model="judge")
    judge.max_concurrency = 1  # as on llama.cpp: the serial engine, which batches a question's answers
    pool = ModelPool(scripted={"task": task, "judge": judge})
    exp = Experiment.from_file(config, pool=pool, progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best", "text:Answer plainly, from the context."],
                                 n_resamples=1000)
    finally:
        exp.close()
    assert len(report.questions) == 10 and task.batches == []  # every answer alone




def test_side_by_side_pairs_decide_the_comparison(run_config: Path) -> None:
    """[judge].paired = "side_by_side": the differences come from one call per question that sees both
    answers (scripted: +1), not from the two pointwise scores (+3), which still give each prompt's mean."""
    import dataclasses

    from fakes import side_by_side_judge_reply

    judge = ScriptedLLM(default=side_by_side_judge_reply, model="judge")
    pool = scripted_pool(judge=judge)
    base = Experiment.from_file(run_config, pool=pool, progress=False).config
    config = dataclasses.replace(base, judge=dataclasses.replace(base.judge, paired="side_by_side"))
    exp = Experiment(config, pool=pool, progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"])
    finally:
        exp.close()
    initial, best = report.prompts
    assert initial.mean is not None and initial.mean.estimate == 2.0
    assert best.mean is not None and best.mean.estimate == 5.0
    v = report.versus[1]
    assert v is not None and v.stats.n == 10 and v.stats.difference.estimate == 1.0
    assert "side by side" in report.judge
    paired_calls = [m for m, _ in judge.calls if "Answer A: " in m[-1].content]
    assert len(paired_calls) == 10
    for messages in paired_calls:  # each holds both prompts' answers, in an order seeded per question
        shown = re.findall(r"^Answer [AB]: (.*)$", messages[-1].content, re.M)
        assert sorted(shown) == ["Using the context: yes.", "Yes."]
