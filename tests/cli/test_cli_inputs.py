"""Commands that fail before they work (issue 66, items 3 and 5): a bad argument, a garbled input or a place
that cannot be written is refused with exit 2 and one line naming it, before any call, line of plan or file."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import experiment_config, judge_reply, optimizer_reply, task_reply, write_toml
from typer.testing import CliRunner, Result

import opro.experiment
from opro.cli import app
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch) -> dict[str, ScriptedLLM]:
    """The scripted models every command of the test gets, which count the calls made."""
    scripted = {role: ScriptedLLM(default=reply, model=role) for role, reply in
                (("task", task_reply), ("judge", judge_reply), ("optimizer", optimizer_reply))}
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: ModelPool(scripted=scripted))
    monkeypatch.setenv("COLUMNS", "300")
    return scripted


def _said(result: Result) -> str:
    return " ".join(result.output.split())


def _refused(result: Result, *named: str) -> None:
    """Exit 2, one error line naming each of ``named``, and nothing printed before it."""
    said = _said(result)
    assert result.exit_code == 2, result.output
    assert result.output.lstrip().startswith("error:"), result.output  # no plan, no power line first
    assert all(n in said for n in named) and "Traceback" not in said, said


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """An empty folder without write bits (refused by its mode: the tests may run as root)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


def test_compare_refuses_a_read_only_store_or_report_folder_before_any_call(
    tmp_path: Path, models: dict[str, ScriptedLLM], read_only: Path
) -> None:
    """Issue 66, item 3: compare did 20 calls, wrote the report and plots, then failed on the store (rc 2,
    "Permission denied: .../mlflow.db.lock") without naming --no-mlflow; a read-only --out likewise."""
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    ask = ["compare", str(config), "--prompt", "text:Answer from the context.", "--no-progress"]
    store = CliRunner().invoke(app, [*ask, "--tracking-uri", f"sqlite:///{read_only / 'mlflow.db'}"])
    _refused(store, "--no-mlflow", f"{read_only} is read-only", "nothing was asked or written")
    out = CliRunner().invoke(app, [*ask, "--no-mlflow", "--out", str(read_only)])
    _refused(out, "--out", f"{read_only} is read-only")
    nested = CliRunner().invoke(app, [*ask, "--no-mlflow", "--out", str(read_only / "report")])
    _refused(nested, "--out", f"{read_only / 'report'} cannot be created: {read_only} is read-only")
    assert not any(m.calls for m in models.values())  # not one LLM call
    assert not list(read_only.iterdir()) and not (tmp_path / "out" / "compare").exists()
    # A folder that can be written: the same comparison runs.
    done = CliRunner().invoke(app, [*ask, "--no-mlflow", "--out", str(tmp_path / "report")])
    assert done.exit_code == 0, done.output
    assert models["judge"].calls and (tmp_path / "report" / "report.json").is_file()


def test_compare_says_a_bad_setting_before_anything_else(tmp_path: Path, models: dict[str, ScriptedLLM]) -> None:
    """Issue 66, item 5: `--set task_model=nonexistent` printed the held-out power line before its error."""
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    bad = CliRunner().invoke(app, ["compare", str(config), "--prompt", "initial", "--set", "task_model=nonexistent",
                                   "--no-mlflow", "--no-progress"])
    _refused(bad, "nonexistent")
    assert "held-out questions" not in _said(bad) and not any(m.calls for m in models.values())


def _garbled(path: Path) -> None:
    path.write_bytes(random.Random(66).randbytes(512))  # not UTF-8 (0xff and friends), not JSON


def _torn(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-9]  # a line cut short, as an interrupted write leaves it
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("damage", "named"), [(_garbled, "line 1: not UTF-8 text"), (_torn, "line 3: invalid JSON")])
def test_plan_and_optimize_refuse_a_damaged_dataset_before_the_plan(
    tmp_path: Path, models: dict[str, ScriptedLLM], damage: object, named: str
) -> None:
    """Issue 66, item 5: a dataset of garbled bytes passed `opro plan` (rc 0), and `opro optimize` printed the
    whole plan, then failed (rc 1) leaving plan.json and .opro.lock in the output folder."""
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    dataset = tmp_path / "qa.jsonl"
    damage(dataset)  # type: ignore[operator]
    for command in ("plan", "optimize"):
        done = CliRunner().invoke(app, [command, str(config), *(["--no-progress"] if command == "optimize" else [])])
        _refused(done, "[data].dataset", str(dataset), named)
        assert "plan for" not in _said(done)
    assert not (tmp_path / "out").exists()  # no plan.json, no .opro.lock, nothing
    assert not any(m.calls for m in models.values())


def test_plan_refuses_split_sizes_the_dataset_cannot_hold(tmp_path: Path, models: dict[str, ScriptedLLM]) -> None:
    """A split asking for more questions than the dataset holds was said only once the run had begun."""
    config = write_toml(experiment_config(tmp_path, questions=12), tmp_path / "exp.toml")
    done = CliRunner().invoke(app, ["plan", str(config)])
    _refused(done, "[data.split] asks for 21 examples", "the dataset has 12")
    assert not (tmp_path / "out").exists()


def test_plan_writes_nothing_into_the_output_folder(tmp_path: Path, models: dict[str, ScriptedLLM],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 66, item 5: `opro plan` "only prints", yet it wrote runs/quickstart/corpus/...pdf: the built-in
    corpus is rendered into the cache folder instead."""
    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = experiment_config(tmp_path)
    cfg["data"] = {"docs": ["builtin:python-reference"], "questions_per_chunk": 1, "max_chunks": 30,
                   "split": cfg["data"]["split"]}
    config = write_toml(cfg, tmp_path / "exp.toml")
    done = CliRunner().invoke(app, ["plan", str(config), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["split"]["heldout"] == 4
    assert not (tmp_path / "out").exists()
    assert list((tmp_path / "cache" / "corpus").glob("*.pdf"))


def test_plan_refuses_a_judge_template_that_is_not_text(tmp_path: Path, models: dict[str, ScriptedLLM]) -> None:
    """Every input file the run reads is read up front: a judge template of other bytes than UTF-8 text was
    a traceback (UnicodeDecodeError) once the judge was built, mid-run."""
    config = write_toml(experiment_config(tmp_path, judge={"template": "judge.txt"}), tmp_path / "exp.toml")
    (tmp_path / "judge.txt").write_bytes("Note la r\u00e9ponse {generated_answer}".encode("latin-1"))
    done = CliRunner().invoke(app, ["plan", str(config)])
    _refused(done, f"cannot read judge template file {tmp_path / 'judge.txt'}")
    assert not (tmp_path / "out").exists()


def test_optimize_refuses_a_damaged_decision_ledger_before_the_plan(
    tmp_path: Path, models: dict[str, ScriptedLLM]
) -> None:
    """A ledger line of bytes no crash can leave was a UnicodeDecodeError traceback; now one line naming the file
    and the line, exit 2, before the plan or any call."""
    from opro.paths import data_dir
    from opro.search.ledger import LEDGER_FILE

    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    data_dir().mkdir(parents=True, exist_ok=True)
    (data_dir() / LEDGER_FILE).write_bytes(b"\x89PNG\r\x1a\x00\xff\xfe")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    _refused(result, f"{data_dir() / LEDGER_FILE}: line 1 of the decision ledger is damaged")
    assert not any(m.calls for m in models.values())
