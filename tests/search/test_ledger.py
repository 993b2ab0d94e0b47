"""The decision ledger: a validation decision cannot be re-bought by a new output folder (a new study store),
a new split seed that reuses the questions whose verdict was seen, a copy of the dataset or a new cache folder."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fakes import experiment_config, scripted_pool, write_toml

from opro.experiment import Experiment
from opro.search.ledger import LEDGER_FILE
from opro.search.study import ValidationReuse
from opro.tracking.commands import mlflow_run_of


def _optimize(tmp_path: Path, *, out: str, seed: int = 1, **optimizer: Any) -> Any:
    """The scripted experiment over ``tmp_path/qa.jsonl`` (28 questions, 12 validation) into ``out``."""
    split = {"exemplar": 2, "optimization": 3, "validation": 12, "heldout": 10, "seed": seed}
    cfg = experiment_config(tmp_path, questions=28, experiment={"name": "t", "output_dir": out, "progress": False},
                            data={"dataset": "qa.jsonl", "split": split}, optimizer={"steps": 1, **optimizer})
    exp = Experiment.from_file(write_toml(cfg, tmp_path / f"{out}.toml"), pool=scripted_pool(), progress=False)
    try:
        return exp.optimize()
    finally:
        exp.close()


def test_a_new_output_folder_or_split_seed_cannot_re_decide_the_validation_questions_of_a_dataset(
    tmp_path: Path,
) -> None:
    """A new output_dir is a new optuna.db: it gave the same validation questions a fresh decision under
    another alpha. A new [data.split].seed reshuffles the same pool: most "new" validation questions
    were seen. Both are refused, naming the earlier verdict; the same decision in another folder is
    the same decision (allowed, and the same verdict)."""
    first = _optimize(tmp_path, out="out1", alpha=0.05)
    assert first.validated
    ledger = tmp_path / LEDGER_FILE  # beside qa.jsonl, read by every output folder of that dataset
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [r["verdict"] for r in records] == [None, records[-1]["verdict"]] and records[-1]["verdict"].startswith(
        "validated: success at look")
    assert records[0]["design"]["min_coverage"] == 0.9 and len(records[0]["questions"]) >= 12
    assert "output folder" in records[0]["where"] and records[0]["where"].endswith("out1")
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.1") as info:
        _optimize(tmp_path, out="out2", alpha=0.1)
    assert "(validated: success at look" in str(info.value) and "out1" in str(info.value)
    assert (tmp_path / "out1" / "metaprompts").is_dir() and not (tmp_path / "out2" / "metaprompts").exists()  # no search
    with pytest.raises(ValidationReuse, match=r"\d+ of these 12 validation questions \(\d+%\) already decided") as info:
        _optimize(tmp_path, out="out3", seed=2, alpha=0.05)
    assert "other settings (" in str(info.value) and "split" in str(info.value)
    same = _optimize(tmp_path, out="out4", alpha=0.05)
    assert same.validated and same.summary()["validation"] == first.summary()["validation"]


def test_the_ledger_counts_shared_questions_keeps_the_latest_verdict_and_survives_a_torn_line(tmp_path: Path) -> None:
    from dataclasses import replace

    from opro.search.ledger import Decision, DecisionLedger

    ledger = DecisionLedger(tmp_path / LEDGER_FILE, origin="output folder x")
    first = Decision(scope="validation", key="a", questions=tuple(f"q{i}" for i in range(10)), design={"alpha": 0.05})
    assert ledger.begin(first) is None and ledger.begin(first) is None  # the same decision: allowed, written once
    ledger.settle(replace(first, verdict="no gain"))
    with ledger.path.open("a") as fh:
        fh.write('{"scope": "valid')  # a crash mid-append
    # One shared question of ten (10%) is allowed; two are not, and the earlier verdict comes back.
    one = Decision(scope="validation", key="b", questions=("q9", *(f"n{i}" for i in range(9))))
    assert ledger.begin(one) is None
    two = Decision(scope="validation", key="c", questions=("q8", "q9", *(f"m{i}" for i in range(8))))
    seen = ledger.begin(two)
    assert seen is not None and (seen.key, seen.verdict, seen.where) == ("a", "no gain", "output folder x")
    assert ledger.begin(replace(two, scope="promotion qa@prod")) is None  # another budget
    assert [(d.key, d.verdict) for d in ledger.decisions()] == [("a", "no gain"), ("b", None), ("c", None)]
    # "a" begun and settled, the fragment, then "b" and the promotion on lines of their own (the refused "c": none).
    assert len(ledger.path.read_text().splitlines()) == 5


def test_the_ledger_is_the_users_in_the_data_folder_with_a_copy_beside_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opro.config import config_from_dict

    def ledger_of(**data: Any) -> Any:
        cfg = config_from_dict(experiment_config(tmp_path, data=data), base_dir=tmp_path / "cfg", source="t.toml")
        exp = Experiment(cfg, pool=scripted_pool(), progress=False)
        try:
            return exp.decisions
        finally:
            exp.close()

    monkeypatch.setenv("OPRO_DATA_DIR", str(tmp_path / "user-data"))
    experiment_config(tmp_path)  # writes qa.jsonl
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "qa.jsonl").write_text((tmp_path / "qa.jsonl").read_text())
    user = tmp_path / "user-data" / LEDGER_FILE  # whatever the call cache, output folder or dataset folder
    before = tmp_path / "cfg" / LEDGER_FILE  # beside calls.sqlite, the config's call cache: where it was kept before
    ledger = ledger_of(dataset=str(tmp_path / "data" / "qa.jsonl"))
    assert (ledger.path, ledger.copies, ledger.also_read) == (user, (tmp_path / "data" / LEDGER_FILE,), (before,))
    from opro.search.ledger import DecisionLedger

    in_folder = DecisionLedger.of_user(tmp_path / "user-data", dataset=tmp_path / "data", origin="")
    assert in_folder.copies == (tmp_path / "data" / LEDGER_FILE,)  # an opro dataset folder: in it
    assert (ledger_of(dataset="").path, ledger_of(dataset="").copies) == (user, ())  # a generated dataset: the user's only
    # A read-only data folder (shared/'s data sets): its copy is read, never written, even by root, who could.
    (tmp_path / "data").chmod(0o555)
    try:
        ledger = ledger_of(dataset=str(tmp_path / "data" / "qa.jsonl"))
        assert (ledger.path, ledger.copies, ledger.also_read) == (user, (), (before, tmp_path / "data" / LEDGER_FILE))
    finally:
        (tmp_path / "data").chmod(0o755)
    # Without OPRO_DATA_DIR: the platform's user data folder (XDG_DATA_HOME), never the cache folder.
    monkeypatch.delenv("OPRO_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path / "home-cache"))
    assert ledger_of(dataset="").path == tmp_path / "xdg-data" / "opro" / LEDGER_FILE


def test_a_damaged_ledger_stops_the_run_naming_the_file_and_the_line(tmp_path: Path) -> None:
    """Bytes that are not text, or a record of the wrong shape, cannot come from a crash mid-append: they refuse
    the run with one line naming the file and the line (a traceback before). A line cut short by a crash is
    said and skipped, as before."""
    from opro.errors import LedgerError
    from opro.search.ledger import Decision, DecisionLedger

    path = tmp_path / LEDGER_FILE
    ledger = DecisionLedger(path)
    ledger.begin(Decision(scope="validation", key="a", questions=("q1",)))
    good = path.read_bytes()
    for damage, why in ((bytes(range(128, 256)), "bytes that are not UTF-8 text"),
                        (b'["scope", "validation"]', "not a decision record: a JSON list, not a record"),
                        (b'{"scope": "validation", "key": "b", "questions": 7}', "not a decision record: 'questions' is int 7, not list"),
                        (b"garbage", "not a JSON record")):
        path.write_bytes(good + damage + b"\n")
        with pytest.raises(LedgerError, match=rf"^{re.escape(str(path))}: line 2 of the decision ledger is damaged "
                                              rf"\({re.escape(why)}.*delete line 2") as info:
            ledger.decisions()
        assert "\n" not in str(info.value)
    path.write_bytes(good + b'{"at": "2026-11-28T10:00:00", "desi')  # a crash mid-append: the record is lost, said
    assert [d.key for d in ledger.decisions()] == ["a"]


def test_a_damaged_ledger_refuses_optimize_before_any_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opro.errors import LedgerError
    from opro.paths import data_dir

    data_dir().mkdir(parents=True, exist_ok=True)
    (data_dir() / LEDGER_FILE).write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(LedgerError, match=rf"{re.escape(str(data_dir() / LEDGER_FILE))}: line 1 of the decision ledger"):
        _optimize(tmp_path, out="out1")
    assert not (tmp_path / "out1" / "metaprompts").exists()


def test_seen_validation_label_re_decides_as_an_exploration_that_never_claims_a_gain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """[optimizer].seen_validation = "label": a decision on questions whose verdict was seen is made (its
    figures shown) but labelled "re-decided after a seen verdict" in every record; the initial instruction
    is returned, never validated, even where the test succeeds. The label blocks and unblocks nothing:
    the earlier decision still refuses another design, and still resumes itself."""
    import logging

    from mlflow import MlflowClient

    from opro.search.study import SearchStudy

    first = _optimize(tmp_path, out="out1", alpha=0.05)
    assert first.validated
    with caplog.at_level(logging.WARNING, logger="opro.search.validation"):
        labelled = _optimize(tmp_path, out="out2", alpha=0.1, seen_validation="label")
    warned = [r.getMessage() for r in caplog.records if "seen_validation = 'label'" in r.getMessage()]
    assert warned and "(validated: success at look" in warned[0] and "no gain is claimed" in warned[0]
    v = labelled.validation
    assert v is not None and v.re_decided and v.looks[-1].decision == "success"  # the test alone would claim
    assert v.winner is None and not any(f.significant for f in v.finalists)
    assert not labelled.validated and labelled.gain is None
    assert labelled.best_instruction == labelled.initial_instruction == "Answer the question."
    assert re.match(r"re-decided after a seen verdict: (\d+) of these \1 validation questions .*\(100%\) already", v.verdict)
    assert "(validated: success at look" in v.verdict and "out1" in v.verdict and "alpha 0.05 -> 0.1" in v.verdict
    assert "explored only (finalist" in v.verdict and "no gain is claimed" in v.verdict
    summary = json.loads((tmp_path / "out2" / "summary.json").read_text())
    assert summary["validated"] is False and summary["gain"] is None
    assert summary["validation"]["re_decided"] is True and summary["validation"]["verdict"] == v.verdict
    assert summary["validation"]["winner"] is None and summary["validation"]["design"]["re_decided"] is True
    records = [json.loads(line) for line in (tmp_path / LEDGER_FILE).read_text().splitlines()]
    marked = [r for r in records if r.get("re_decided")]
    assert marked and all("out2" in r["where"] for r in marked)
    assert marked[-1]["verdict"].startswith("re-decided after a seen verdict, not validated: success at look")
    study = SearchStudy.load(f"sqlite:///{tmp_path / 'out2' / 'optuna.db'}", name=labelled.study_name)
    assert study is not None
    [decision] = study.validation_decisions()
    assert decision.re_decided and decision.verdict == marked[-1]["verdict"]
    uri = f"sqlite:///{tmp_path / 'out2' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    tags = client.get_run(mlflow_run_of(labelled.recorded)).data.tags
    assert tags["opro.re_decided"] == "true" and tags["opro.validated"] == "false" and tags["opro.gain"] == "none"
    assert client.get_prompt_version_by_alias("qa-test", "latest-best").tags["opro.validated"] == "false"
    # In the first decision's own storage too (another min_coverage), and it does not block that decision.
    again = _optimize(tmp_path, out="out1", alpha=0.05, min_coverage=0.8, seen_validation="label")
    assert again.validation is not None and again.validation.re_decided and not again.validated
    assert _optimize(tmp_path, out="out1", alpha=0.05).summary()["validation"] == first.summary()["validation"]
    # The default still refuses the labelled design, naming the first decision (not the labelled one).
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.1") as info:
        _optimize(tmp_path, out="out3", alpha=0.1)
    assert "(validated: success at look" in str(info.value) and "out1" in str(info.value)
    assert "out2" not in str(info.value) and 'seen_validation = "label"' in str(info.value)


# -- one ledger per user, keyed by the questions' content, outliving the cache ---------------------------------------


def _in_folder(tmp_path: Path, folder: str, *, out: str, alpha: float, cache: str = "cache/calls.sqlite",
               **optimizer: Any) -> Any:
    """The scripted experiment over ``tmp_path/<folder>/qa.jsonl`` (the same 28 questions in each folder), its
    call cache at ``cache``, into ``out``."""
    split = {"exemplar": 2, "optimization": 3, "validation": 12, "heldout": 10, "seed": 1}
    cfg = experiment_config(tmp_path, questions=28, experiment={"name": "t", "output_dir": out, "progress": False,
                                                                "cache_path": cache},
                            data={"dataset": f"{folder}/qa.jsonl", "split": split},
                            optimizer={"steps": 1, "alpha": alpha, **optimizer})
    (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / folder / "qa.jsonl").write_text((tmp_path / "qa.jsonl").read_text())
    exp = Experiment.from_file(write_toml(cfg, tmp_path / f"{out}.toml"), pool=scripted_pool(), progress=False)
    try:
        return exp.optimize()
    finally:
        exp.close()


def test_a_copy_of_the_dataset_in_another_folder_cannot_re_decide_its_validation_questions(tmp_path: Path) -> None:
    """The user's ledger is read whatever folder the dataset sits in; the copy beside each dataset is written
    too. The same decision from the copy is the same decision: allowed, the same verdict."""
    first = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    assert first.validated
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.2") as info:
        _in_folder(tmp_path, "b", out="out2", alpha=0.2)
    assert "(validated: success at look" in str(info.value) and "out1" in str(info.value)
    assert _user_ledger().is_file() and (tmp_path / "a" / LEDGER_FILE).is_file()
    assert not (tmp_path / "out2" / "metaprompts").exists()  # refused before the search
    same = _in_folder(tmp_path, "b", out="out3", alpha=0.05)
    assert same.validated and same.summary()["validation"] == first.summary()["validation"]


def _user_ledger() -> Path:
    from opro.paths import data_dir

    return data_dir() / LEDGER_FILE


def test_deleting_the_cache_folder_loses_answers_never_decisions(tmp_path: Path) -> None:
    """The ledger lived beside the call cache: deleting the cache folder lost it, a copy of the dataset in another
    folder then decided again at alpha 0.2, and the first decision's own rerun was refused by the later one. It
    lives in the user data folder now: the copy is refused whatever cache folder it names, and the original
    resumes."""
    import shutil

    first = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    assert first.validated
    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.2"):
        _in_folder(tmp_path, "b", out="out2", alpha=0.2)
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.2"):  # another cache folder: the same user
        _in_folder(tmp_path, "b", out="out3", alpha=0.2, cache="elsewhere/calls.sqlite")
    assert not (tmp_path / "out2" / "metaprompts").exists() and not (tmp_path / "out3" / "metaprompts").exists()
    resumed = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    assert resumed.summary()["validation"] == first.summary()["validation"]


def test_a_ledger_kept_beside_the_call_cache_by_an_earlier_opro_is_brought_home(tmp_path: Path) -> None:
    import shutil

    first = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    (tmp_path / "cache").mkdir(exist_ok=True)
    shutil.move(_user_ledger(), tmp_path / "cache" / LEDGER_FILE)  # where opro kept it before
    (tmp_path / "a" / LEDGER_FILE).unlink()
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.2"):
        _in_folder(tmp_path, "b", out="out2", alpha=0.2)
    assert '"verdict": "validated: success at look' in _user_ledger().read_text()
    assert _in_folder(tmp_path, "a", out="out1", alpha=0.05).summary()["validation"] == first.summary()["validation"]


def test_a_deleted_ledger_is_reported_as_a_re_decision_where_a_study_saw_the_lost_verdict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Deleting the ledger stays possible: a decision made without it is made. Where it is seen (a study that
    recorded a decision the ledger no longer holds) the lost record is written back and the decision made
    since on its questions is recorded as re-decided: it refuses nothing and can no longer resume as a claim."""
    import logging

    first = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    assert first.validated
    for ledger in (_user_ledger(), tmp_path / "a" / LEDGER_FILE):
        ledger.unlink(missing_ok=True)
    again = _in_folder(tmp_path, "a", out="out2", alpha=0.2)  # nothing knows: made
    assert again.validation is not None and again.validation.looks
    with caplog.at_level(logging.WARNING, logger="opro.search.ledger"):
        resumed = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    assert resumed.summary()["validation"] == first.summary()["validation"]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "lacked a decision that study 't' holds (validated: success at look" in said
    assert "out2) is now recorded as re-decided after a seen verdict: it claims nothing" in said
    records = [json.loads(line) for line in _user_ledger().read_text().splitlines()]
    marked = [r for r in records if r.get("re_decided")]
    assert len(marked) == 1 and "out2" in marked[0]["where"] and "out1" not in marked[0]["where"]
    assert marked[0]["verdict"].startswith("re-decided after a seen verdict (made where the verdict made in")
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.2") as info:
        _in_folder(tmp_path, "a", out="out2", alpha=0.2)
    assert "out1" in str(info.value)


def test_the_copy_beside_the_dataset_brings_back_a_lost_user_ledger_and_puts_decisions_back_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The user ledger lost (another machine, a deleted data folder): a copy of the dataset elsewhere decides at
    alpha 0.2 on the same questions. The first decision's dataset-side copy still holds it: on the next start
    it is written back, the later decision is recorded as re-decided, the first resumes, and the later one
    is refused from then on (it had been the one standing, refusing the first)."""
    import logging

    first = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    _user_ledger().unlink()
    later = _in_folder(tmp_path, "b", out="out2", alpha=0.2)  # nothing it reads knows the first: made
    assert later.validation is not None and not later.validation.re_decided
    with caplog.at_level(logging.WARNING, logger="opro.search.ledger"):
        resumed = _in_folder(tmp_path, "a", out="out1", alpha=0.05)
    assert resumed.summary()["validation"] == first.summary()["validation"]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"lacked a decision that {tmp_path / 'a' / LEDGER_FILE} holds (validated: success at look" in said
    assert "is now recorded as re-decided after a seen verdict" in said
    with pytest.raises(ValidationReuse, match=r"alpha 0\.05 -> 0\.2"):
        _in_folder(tmp_path, "b", out="out2", alpha=0.2)
    for ledger in (_user_ledger(), tmp_path / "b" / LEDGER_FILE):  # b's copy learns it on b's next start
        marked = [json.loads(line) for line in ledger.read_text().splitlines() if '"re_decided": true' in line]
        assert len(marked) == 1 and "out2" in marked[0]["where"], ledger


def test_the_same_model_on_another_port_resumes_the_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 61: the fingerprint held each role's base_url, so the same model served on another port was refused
    as if it were another model. It names the model; a study recorded with a base_url still resumes."""
    import opro.search.study
    from opro.config import config_from_dict

    monkeypatch.setenv("OPRO_TEST_KEY", "sk-test")

    def fingerprint(port: int, model: str = "qwen") -> dict[str, str]:
        models = {"task": {"backend": "openai", "model": model, "base_url": f"http://127.0.0.1:{port}/v1",
                           "api_key_env": "OPRO_TEST_KEY"}}
        cfg = config_from_dict(experiment_config(tmp_path, models=models), base_dir=tmp_path, source="t.toml")
        exp = Experiment(cfg, pool=scripted_pool(), progress=False)
        try:
            return exp.fingerprint()
        finally:
            exp.close()

    study = opro.search.study.SearchStudy.open(f"sqlite:///{tmp_path / 'optuna.db'}", name="s")
    study.check_fingerprint(fingerprint(8001))
    study.check_fingerprint(fingerprint(8002))  # the same model on another port: resumed
    with pytest.raises(opro.search.study.FingerprintMismatch, match=r"models\.task\.model: 'qwen' -> 'llama'"):
        study.check_fingerprint(fingerprint(8002, model="llama"))
    older = opro.search.study.SearchStudy.open(f"sqlite:///{tmp_path / 'optuna.db'}", name="older")
    older.check_fingerprint({**fingerprint(8001), "models.task.base_url": "http://127.0.0.1:8001/v1"})
    older.check_fingerprint(fingerprint(8002))
