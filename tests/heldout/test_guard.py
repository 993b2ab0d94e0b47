"""The held-out guard (opro.heldout.guard): a question called held-out was never seen by the optimization
that tuned a compared or evaluated prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import optimized, scripted_pool, write_config
from typer.testing import CliRunner

from opro.data.dataset import Example, GoldenDataset
from opro.errors import DataError
from opro.experiment import Experiment
from opro.export.sources import resolve_prompt
from opro.heldout.compare import compare_prompts
from opro.heldout.guard import check_heldout_leakage


def test_leakage_is_refused_naming_the_questions() -> None:
    from opro.data.dataset import Split, content_hash

    examples = tuple(Example(query=f"What is item {i}?", reference_answer="x") for i in range(6))
    check_heldout_leakage(GoldenDataset(examples).with_split(exemplar=1, optimization=2, heldout=3, seed=0))
    # Example 6 is example 1 up to case and punctuation; a hand-made split puts it in held-out.
    leaky = (*examples, Example(query="what is ITEM 1", reference_answer="y"))
    split = Split(seed=0, exemplar=(0,), optimization=(1, 2), heldout=(3, 4, 5, 6), dataset_hash=content_hash(leaky))
    with pytest.raises(
        DataError, match=r"refusing to call this comparison held-out: 1 held-out.*'what is ITEM 1' \(also in optimization split\)"
    ):
        check_heldout_leakage(GoldenDataset(leaky, split))


def test_a_run_optimized_on_another_split_is_refused(tmp_path: Path) -> None:
    optimized(tmp_path / "a", seed=1)
    other = write_config(tmp_path / "b", name="b", seed=2)
    exp = Experiment.from_file(other, pool=scripted_pool(), progress=False)
    try:
        with pytest.raises(DataError, match=r"comes from the optimization in .*which saw \d+ of these held-out "
                                            r"question\(s\): 'Fact number \d+ about AlexNet\?' \(in its \w+ split\)"):
            compare_prompts(experiment=exp, prompts=["initial", f"run:{tmp_path / 'a' / 'out'}"])
        # Not called held-out, the same comparison runs.
        report = compare_prompts(experiment=exp, prompts=["initial", f"run:{tmp_path / 'a' / 't.toml'}"], split="optimization")
        assert not report.leakage_checked and report.split == "optimization"
    finally:
        exp.close()


def test_resplit_in_place_after_optimize_is_refused_naming_the_moved_questions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's scenario: optimize with seed 1, change [data.split].seed to 2 in place, compare."""
    import optuna

    from opro.cli import app
    from opro.config import load_config
    from opro.heldout.guard import LEAKAGE_RECORDED, load_split_record

    path = optimized(tmp_path, seed=1)
    out = tmp_path / "out"
    record = load_split_record(out)
    assert record is not None and json.loads((out / "split_record.json").read_text()) == record
    assert json.loads((out / "summary.json").read_text())["split_record"] == record
    cfg = load_config(path)
    study = optuna.load_study(study_name=cfg.study_name, storage=cfg.optuna_storage)
    assert study.user_attrs["split_record"] == record
    exp = Experiment.from_file(path, pool=scripted_pool(), progress=False)
    try:
        seen = {e.query for n in ("exemplar", "optimization", "validation")
                for e in exp.dataset.examples_in(n)}  # type: ignore[arg-type]
        report = compare_prompts(experiment=exp, prompts=["initial", "best"], n_resamples=100)
        assert report.leakage_basis == LEAKAGE_RECORDED
    finally:
        exp.close()

    write_config(tmp_path, seed=2)  # same output_dir: the dataset is re-split in place
    exp = Experiment.from_file(path, pool=scripted_pool(), progress=False)
    try:
        moved = seen & {e.query for e in exp.dataset.examples_in("heldout")}
        assert moved  # seed 2 moves questions the optimization saw into held-out
        with pytest.raises(DataError, match=r"seen by the optimization.*split changed.*seed 1") as err:
            compare_prompts(experiment=exp, prompts=["initial", "best"])
        assert f"{len(moved)} held-out question(s)" in str(err.value)
        assert sum(repr(q) in str(err.value) for q in moved) == min(5, len(moved))
    finally:
        exp.close()
    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    monkeypatch.setenv("COLUMNS", "400")
    res = CliRunner().invoke(app, ["evaluate", str(path), "--split", "heldout", "--no-progress"])
    assert res.exit_code == 2 and "seen by the optimization" in res.output  # one exit code for one refusal
    assert sorted(moved)[0] in res.output.replace("\n", "")
    res = CliRunner().invoke(app, ["compare", str(path), "--no-mlflow", "--no-progress"])
    assert res.exit_code == 2 and "seen by the optimization" in res.output
    # Every split can be scored (not called held-out): the validation split too.
    res = CliRunner().invoke(app, ["evaluate", str(path), "--split", "validation", "--no-progress"])
    assert res.exit_code == 0, res.output


def test_a_changed_split_without_overlap_is_refused_and_no_record_says_current_only(tmp_path: Path) -> None:
    from opro.data.dataset import split_record
    from opro.heldout.guard import LEAKAGE_CURRENT_ONLY, check_heldout, check_heldout_against_record

    examples = tuple(Example(query=f"What is item {i}?", reference_answer="x") for i in range(8))
    ds = GoldenDataset(examples).with_split(exemplar=1, optimization=2, heldout=3, seed=0)
    assert check_heldout(ds, output_dir=tmp_path) == LEAKAGE_CURRENT_ONLY
    record = split_record(ds)
    check_heldout_against_record(ds, record=record)
    assert ds.split is not None
    # Same exemplar/optimization questions, one more held-out question: the split changed.
    from dataclasses import replace

    used = {*ds.split.exemplar, *ds.split.optimization, *ds.split.heldout}
    spare = min(set(range(8)) - used)
    grown = replace(ds, split=replace(ds.split, heldout=(*ds.split.heldout, spare)))
    with pytest.raises(DataError, match=r"the split changed since the optimization recorded it.*restore the \[data.split\]"):
        check_heldout_against_record(grown, record=record)
    # A paraphrase of a recorded optimization question in held-out is refused by its normalized text.
    seen_q = ds.examples_in("optimization")[0].query
    leaky = (*examples, Example(query=seen_q.replace("What is", "What's").upper(), reference_answer="y"))
    s = ds.split
    from opro.data.dataset import Split, content_hash

    split = Split(seed=0, exemplar=s.exemplar, optimization=s.optimization, validation=s.validation,
                  heldout=(*s.heldout, 8), dataset_hash=content_hash(leaky))
    with pytest.raises(DataError, match=r"1 held-out question\(s\) were seen by the optimization.*was in the optimization split"):
        check_heldout_against_record(GoldenDataset(leaky, split), record=record)
    # A near-duplicate (not the same normalized text) is refused too, named as such.
    near = (*examples, Example(query=seen_q.replace("What is", "What is the"), reference_answer="y"))
    split = replace(split, dataset_hash=content_hash(near))
    with pytest.raises(DataError, match=r"1 held-out question\(s\) were seen.*optimization, as a near-duplicate"):
        check_heldout_against_record(GoldenDataset(near, split), record=record)


def test_the_questions_a_validation_may_extend_into_are_recorded_and_never_held_out(tmp_path: Path) -> None:
    """The extension pool is the questions in no split (never held-out), in a seeded order; the split
    record keeps it, so a later re-split that moves one of them into held-out is refused."""
    from dataclasses import replace

    from opro.data.dataset import split_record
    from opro.heldout.guard import check_heldout_against_record

    examples = tuple(Example(query=f"Which colour has bird number {i}?", reference_answer="x") for i in range(20))
    ds = GoldenDataset(examples).with_split(exemplar=2, optimization=3, validation=4, heldout=5, seed=3)
    assert ds.split is not None
    pool = ds.unused()
    placed = {examples[i] for n in ("exemplar", "optimization", "validation", "heldout")
              for i in ds.split.indices(n)}  # type: ignore[arg-type]
    assert len(pool) == 6 and not set(pool) & placed
    assert pool == ds.unused() and [e.query for e in pool] != sorted(e.query for e in pool)  # seeded, shuffled
    record = split_record(ds, extension=pool[:4])
    assert len(record["questions"]["extension"]) == 4
    check_heldout_against_record(ds, record=record)
    moved = examples.index(pool[0])
    resplit = replace(ds, split=replace(ds.split, heldout=(*ds.split.heldout, moved)))
    with pytest.raises(DataError, match=r"1 held-out question\(s\) were seen by the optimization.*was in the extension"):
        check_heldout_against_record(resplit, record=record)


def test_every_prompt_source_is_checked_by_its_provenance_or_reported_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, item 1: another run's prompt was checked against its exemplar and optimization
    questions only (not the validation questions that chose it), its exported JSON and its registry
    version not at all, and a literal was reported as clean."""
    from opro.cli import app
    from opro.errors import LeakageError
    from opro.export import export_prompt

    optimized(tmp_path / "a", seed=1)
    a_out = (tmp_path / "a" / "out").resolve()
    other = write_config(tmp_path / "b", name="b", seed=2)
    exported = export_prompt(resolve_prompt(f"run:{a_out}"), format="json", out=tmp_path / "exp").paths[0]
    a_registry = f"sqlite:///{a_out / 'mlflow.db'}"
    exp = Experiment.from_file(other, pool=scripted_pool(), progress=False)
    try:
        with pytest.raises(LeakageError, match=r"\(in its validation split\)"):  # the split that chose A's winner
            compare_prompts(experiment=exp, prompts=["initial", f"run:{a_out}"])
        with pytest.raises(LeakageError, match=r"prompt '.*prompt.json' comes from the optimization in"):
            compare_prompts(experiment=exp, prompts=["initial", str(exported)])
        with pytest.raises(LeakageError, match=r"prompt 'prompts:/qa-t@latest-best' comes from the optimization in"):
            compare_prompts(experiment=exp, prompts=["initial", "prompts:/qa-t@latest-best"], tracking_uri=a_registry)
    finally:
        exp.close()
    # In A's own config: what was checked is said per prompt; a literal is unchecked, never clean.
    exp = Experiment.from_file(tmp_path / "a" / "t.toml", pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best", "text:Answer from the context."],
                                 n_resamples=1000)
    finally:
        exp.close()
    by = report.leakage_by_prompt
    assert by["initial"].startswith("the config's initial instruction") and by["best"].startswith("this config's own")
    assert by["Answer from the context."].startswith("unchecked: its provenance names no opro run")
    report.write(tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "- Answer from the context.: unchecked:" in md
    # An unchecked prompt cannot be promoted, however significant its gain.
    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    monkeypatch.setenv("COLUMNS", "300")
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "a" / "t.toml"), "--prompt", "text:Answer from the context.",
                                   "--promote", "lit", "--no-mlflow", "--no-progress"])
    assert res.exit_code == 1 and "only a prompt whose tuning questions are known can be promoted" in " ".join(res.output.split())


def test_paraphrases_stay_in_one_split_and_a_held_out_paraphrase_is_refused_where_embeddings_exist() -> None:
    """Issue 40, item 5: "What year did AlexNet win ImageNet?" went to exemplar and its paraphrase to
    held-out, and the lexical check passed. With embeddings (here a fake that knows the pair shares a
    meaning), the split keeps them together and the guard names a paraphrase across splits."""
    import numpy as np

    from opro.data.dataset import Split, content_hash, normalize_question, related_groups, split_record
    from opro.errors import LeakageError
    from opro.heldout.guard import check_heldout_against_record

    first, para = "What year did AlexNet win ImageNet?", "In which year was the ImageNet challenge taken by AlexNet?"
    meaning: dict[str, int] = {normalize_question(first): 0, normalize_question(para): 0}

    def embed(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 64))
        for row, t in enumerate(texts):
            out[row, meaning.setdefault(normalize_question(t), len(set(meaning.values())))] = 1.0
        return out

    others = [f"Which layer number {i} uses dropout?" for i in range(10)]
    examples = tuple(Example(query=q, reference_answer="x") for q in [first, para, *others])
    assert [0, 1] not in related_groups(examples)  # the lexical check does not see it
    assert [0, 1] in related_groups(examples, embed=embed)
    for seed in range(5):
        ds = GoldenDataset(examples).with_split(exemplar=3, optimization=3, heldout=4, seed=seed, embed=embed)
        assert ds.split is not None and sum(i in ds.split.heldout for i in (0, 1)) in (0, 2)
    # A split made without embeddings that put them apart: the guard refuses, naming the paraphrase.
    split = Split(seed=0, exemplar=(0, 2), optimization=(3, 4), heldout=(1, 5, 6), dataset_hash=content_hash(examples))
    apart = GoldenDataset(examples, split)
    record = split_record(apart)
    check_heldout_against_record(apart, record=record)  # lexical only: passes, as before
    with pytest.raises(LeakageError, match=r"was in the exemplar, as a paraphrase \(cosine 1.00\)"):
        check_heldout_against_record(apart, record=record, embed=embed)


def test_a_split_record_kept_from_before_the_extension_learns_the_extension(tmp_path: Path) -> None:
    """A run recorded before validations could extend, resumed by this version, may ask unused
    questions: its kept record gains them, so the guard knows every question the run could see."""
    config = optimized(tmp_path, heldout=6)  # 28 questions, 23 in the split: 5 unused
    path = tmp_path / "out" / "split_record.json"
    record = json.loads(path.read_text())
    assert len(record["questions"]["extension"]) == 5
    for part in ("questions", "normalized"):
        del record[part]["extension"]
    path.write_text(json.dumps(record))
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        exp.optimize()  # the study exists: its record stands, and learns the extension
    finally:
        exp.close()
    again = json.loads(path.read_text())
    assert len(again["questions"]["extension"]) == 5 and len(again["normalized"]["extension"]) == 5
    assert again["split_sha256"] == record["split_sha256"]
