from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import SHARED_ALEXNET
from typer.testing import CliRunner

from opro.cli import app
from opro.data.dataset import (
    SPLIT_NAMES,
    Example,
    GoldenDataset,
    import_qa,
    load_dataset,
    make_split,
    normalize_question,
)
from opro.errors import DataError

SHARED = SHARED_ALEXNET
needs_shared = pytest.mark.usefixtures("shared_alexnet")


def _examples(n: int) -> tuple[Example, ...]:
    return tuple(Example(query=f"Question number {i}?", reference_answer=f"Answer {i}.") for i in range(n))


@needs_shared
def test_labelled_rag_dataset_loads_as_is_and_round_trips_unchanged(tmp_path: Path) -> None:
    original = json.loads((SHARED / "rag_dataset.json").read_text(encoding="utf-8"))
    ds = load_dataset(SHARED / "rag_dataset.json")
    assert len(ds) == 160 and ds.split is None
    first = ds.examples[0]
    assert first.query_by == {"model_name": "gpt-3.5-turbo", "type": "ai"}
    assert len(first.reference_contexts) == 1
    out = ds.save(tmp_path / "alexnet")
    saved = json.loads((out / "rag_dataset.json").read_text(encoding="utf-8"))
    assert saved == original  # same keys, values and order of examples
    assert list(saved["examples"][0]) == ["query", "query_by", "reference_contexts", "reference_answer", "reference_answer_by"]
    assert load_dataset(out).content_hash == ds.content_hash


def test_split_is_disjoint_seeded_and_saved(tmp_path: Path) -> None:
    ds = GoldenDataset(_examples(30))
    a = ds.with_split(exemplar=3, optimization=10, heldout=None, seed=7)
    assert a.split is not None
    assert a.split.sizes == {"exemplar": 3, "optimization": 10, "validation": 0, "heldout": 17}
    sets = [set(a.split.indices(n)) for n in SPLIT_NAMES]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert set().union(*sets) == set(range(30))
    assert ds.with_split(exemplar=3, optimization=10, heldout=None, seed=7).split == a.split  # deterministic
    assert ds.with_split(exemplar=3, optimization=10, heldout=None, seed=8).split != a.split
    limited = ds.with_split(exemplar=2, optimization=5, heldout=5, seed=0)
    assert limited.split is not None and limited.split.sizes == {"exemplar": 2, "optimization": 5, "validation": 0, "heldout": 5}

    path = a.save(tmp_path / "ds")
    split_json = json.loads((path / "split.json").read_text())
    assert split_json["seed"] == 7 and split_json["dataset_hash"] == ds.content_hash
    assert split_json["sizes"] == {"exemplar": 3, "optimization": 10, "validation": 0, "heldout": 17}
    loaded = GoldenDataset.load(path)
    assert loaded.split == a.split
    assert loaded.examples_in("heldout") == a.examples_in("heldout")
    with pytest.raises(DataError, match="unknown split"):
        loaded.examples_in("train")  # type: ignore[arg-type]


def test_split_refuses_a_changed_dataset(tmp_path: Path) -> None:
    path = GoldenDataset(_examples(10)).with_split(exemplar=2, optimization=4, heldout=None, seed=0).save(tmp_path / "ds")
    data = json.loads((path / "rag_dataset.json").read_text())
    data["examples"][0]["reference_answer"] = "changed"
    (path / "rag_dataset.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match="split was made for different dataset contents"):
        load_dataset(path)


def test_leakage_guard_keeps_duplicate_questions_in_one_split() -> None:
    base = list(_examples(20))
    dupes = [
        Example(query="question NUMBER 3", reference_answer="Another answer."),
        Example(query="Question number 3?!", reference_answer="Third answer."),
        Example(query="  question   number 11. ", reference_answer="x"),
    ]
    examples = base + dupes
    for seed in range(20):
        split = make_split(examples, exemplar=3, optimization=8, heldout=None, seed=seed)
        owner: dict[str, str] = {}
        for name in SPLIT_NAMES:
            for i in split.indices(name):
                key = normalize_question(examples[i].query)
                assert owner.setdefault(key, name) == name, f"seed {seed}: {key!r} leaks across splits"


def test_split_sizes_are_checked() -> None:
    with pytest.raises(DataError, match="exceed the 5 examples"):
        make_split(_examples(5), exemplar=3, optimization=3, heldout=None, seed=0)
    with pytest.raises(DataError, match="no split"):
        GoldenDataset(_examples(3)).examples_in("exemplar")


def test_import_jsonl_csv_json_with_field_names(tmp_path: Path) -> None:
    jl = tmp_path / "qa.jsonl"
    jl.write_text('{"q": "What is A?", "a": "A is a letter.", "ctx": ["A is the first letter."]}\n\n{"q": "What is B?", "a": "B."}\n')
    with pytest.raises(DataError, match=r"qa\.jsonl: line 3: missing field 'ctx'"):
        import_qa(jl, query_field="q", answer_field="a", contexts_field="ctx")
    ds = import_qa(jl, query_field="q", answer_field="a")
    assert [e.query for e in ds.examples] == ["What is A?", "What is B?"]
    assert ds.examples[0].reference_contexts == ()  # contexts only when their field is named or detected

    with pytest.raises(DataError, match=r"no query field found .*name it with --query-field \(in a config: "
                                         r"\[data\]\.query_field\)"):
        import_qa(jl)
    # A byte-order mark (what Excel and Notepad write) is read past, in JSONL and in a CSV's header.
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + jl.read_bytes())
    assert [e.query for e in import_qa(bom, query_field="q", answer_field="a").examples] == ["What is A?", "What is B?"]
    bom_csv = tmp_path / "bom.csv"
    bom_csv.write_bytes(b"\xef\xbb\xbfquestion,answer\nWhat is E?,E.\n")
    assert [e.query for e in import_qa(bom_csv).examples] == ["What is E?"]

    csv_path = tmp_path / "qa.csv"
    csv_path.write_text('question,answer,contexts\nWhat is C?,C.,"[""c one"", ""c two""]"\nWhat is D?,,\n')
    with pytest.raises(DataError, match=r"qa\.csv: row 3: field 'answer' is empty"):
        import_qa(csv_path)
    csv_path.write_text('question,answer,contexts\nWhat is C?,C.,"[""c one"", ""c two""]"\nWhat is D?,D.,plain ctx\n')
    ds = load_dataset(csv_path)  # fields detected
    assert ds.examples[0].reference_contexts == ("c one", "c two")
    assert ds.examples[1].reference_contexts == ("plain ctx",)

    js = tmp_path / "qa.json"
    js.write_text(json.dumps([{"prompt": "What is E?", "expected_answer": "E."}]))
    assert load_dataset(js).examples[0].reference_answer == "E."
    js.write_text(json.dumps([{"text": "no question here"}]))
    with pytest.raises(DataError, match=r"qa\.json: record 0: no query field found.*--query-field"):
        load_dataset(js)


def test_bad_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"examples": [')
    with pytest.raises(DataError, match=r"broken\.json: invalid JSON at line 1"):
        load_dataset(bad)
    lrd = tmp_path / "lrd.json"
    lrd.write_text(json.dumps({"examples": [{"query": "Q?", "reference_answer": ""}]}))
    with pytest.raises(DataError, match=r"lrd\.json: examples\[0\]: field 'reference_answer' is missing or empty"):
        load_dataset(lrd)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(DataError, match=r"x\.parquet: unsupported dataset file type"):
        load_dataset(tmp_path / "x.parquet")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DataError, match="not an opro dataset directory"):
        load_dataset(tmp_path / "emptydir")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json"])
def test_bytes_that_are_not_utf8_are_named_by_their_line(tmp_path: Path, suffix: str) -> None:
    """Issue 66, item 5: a file saved in Latin-1 was "cannot be read ('utf-8' codec can't decode byte 0xe9 in
    position 61 ...)": where in the file, and what to do, were left to the user."""
    lines = {".jsonl": ['{"question": "Q1?", "answer": "A1."}', '{"question": "Q2?", "answer": "A2."}',
                        '{"question": "Caf\u00e9?", "answer": "Yes."}'],
             ".csv": ["question,answer", "Q1?,A1.", "Caf\u00e9?,Yes."],
             ".json": ["[", '{"question": "Q1?", "answer": "A1."},', '{"question": "Caf\u00e9?", "answer": "Yes."}]']}
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes("\n".join(lines[suffix]).encode("latin-1"))
    with pytest.raises(DataError, match=rf"latin1\{suffix}: line 3: not UTF-8 text \(byte 0xe9\); save the file as UTF-8"):
        load_dataset(path)


def test_cli_import_split_show(tmp_path: Path) -> None:
    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps({"question": f"Q{i}?", "answer": f"A{i}"}) + "\n" for i in range(12)))
    runner = CliRunner()
    out = tmp_path / "ds"
    res = runner.invoke(app, ["dataset", "import", str(src), "--out", str(out), "--exemplar", "2", "--heldout", "4", "--seed", "3"])
    assert res.exit_code == 0, res.output
    ds = load_dataset(out)
    assert ds.split is not None and ds.split.sizes == {"exemplar": 2, "optimization": 3, "validation": 3, "heldout": 4}
    res = runner.invoke(app, ["dataset", "split", str(out), "--exemplar", "1", "--optimization", "3", "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert load_dataset(out).split.sizes == {"exemplar": 1, "optimization": 3, "validation": 4, "heldout": 4}  # type: ignore[union-attr]
    res = runner.invoke(app, ["dataset", "show", str(out), "-n", "2"])
    assert res.exit_code == 0, res.output
    shown = " ".join(res.output.split())
    assert "12 examples" in shown and "exemplar 1, optimization 3, validation 4, heldout 4" in shown and "Q0?" in shown
    res = runner.invoke(app, ["dataset", "split", str(out), "--optimization", "2", "--validation", "5", "--heldout", "2"])
    assert res.exit_code == 0, res.output
    assert load_dataset(out).split.sizes == {"exemplar": 3, "optimization": 2, "validation": 5, "heldout": 2}  # type: ignore[union-attr]
    res = runner.invoke(app, ["dataset", "import", str(tmp_path / "missing.csv"), "--out", str(out)])
    assert res.exit_code == 1 and "missing.csv" in res.output
    res = runner.invoke(app, ["dataset", "split", str(out), "--optimization", "0"])  # the search needs questions
    assert res.exit_code == 2 and "--optimization" in res.output
    split_file = out / "split.json"
    edited = json.loads(split_file.read_text())
    edited["heldout"] = [*edited["heldout"], 999]
    split_file.write_text(json.dumps(edited))
    res = runner.invoke(app, ["dataset", "show", str(out)])
    assert res.exit_code != 0
    assert f"{split_file}: split 'heldout' refers to example 999" in " ".join(res.output.split())
    assert "opro dataset split" in res.output
    split_file.write_text("[1, 2]")  # not the object a split file is
    res = runner.invoke(app, ["dataset", "show", str(out)])
    shown = " ".join(res.output.split())
    assert res.exit_code == 1 and f"{split_file}: not a valid split file (not an object of seed" in shown, shown
    assert "re-split the folder with `opro dataset split`" in shown and "Error(" not in shown
    res = runner.invoke(app, ["dataset", "split", str(out)])  # which mends it
    assert res.exit_code == 0, res.output
    assert load_dataset(out).split is not None


def test_normalization_reads_contractions_unicode_hyphens_and_underscores() -> None:
    assert normalize_question("What's AlexNet?") == normalize_question("What is AlexNet")
    assert normalize_question("Isn’t it ReLU-based?") == normalize_question("is not it relu based")
    assert normalize_question("ＡｌｅｘＮｅｔ\u2014GPU_count") == normalize_question("alexnet gpu count")
    assert normalize_question("Who won't train it?") == normalize_question("who will not train it")
    assert normalize_question("AlexNet's size") != normalize_question("AlexNet is size")  # a possessive stays


def test_related_groups_are_the_components_of_same_question() -> None:
    """The grouping reads each question's features once and reuses one matcher per question; it must
    still be exactly the connected components of the pairwise ``same_question`` relation."""
    import random

    from opro.data.dataset import is_near_duplicate, related_groups, same_question

    rng = random.Random(7)
    words = ["AlexNet", "GPU", "layers", "dropout", "top-5", "error", "ImageNet", "ReLU", "paper", "2012"]
    stems = [f"What is the {rng.choice(words)} of the {rng.choice(words)} {rng.choice(words)}?" for _ in range(40)]
    variants = [
        lambda q: q,
        lambda q: q.replace("What is", "What's"),
        lambda q: q.upper().replace("?", " ?"),
        lambda q: q.replace("of the", "in the"),
        lambda q: q.replace("?", " in 2012?"),
        lambda q: q.replace("top-5", "top 5"),
    ]
    queries = [rng.choice(variants)(rng.choice(stems)) for _ in range(90)]
    examples = [Example(query=q, reference_answer="a") for q in queries]
    parent = list(range(len(queries)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(queries)):
        for j in range(len(queries)):  # both orders: the relation is read as given, not assumed symmetric
            if i != j and same_question(queries[i], queries[j]):
                a, b = find(i), find(j)
                parent[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = {}
    for i in range(len(queries)):
        components.setdefault(find(i), []).append(i)
    groups = related_groups(examples)
    assert sorted(map(sorted, groups)) == sorted(components.values())
    assert 5 < len(groups) < len(queries)  # the set has both related and unrelated questions
    assert same_question("What's the top-5 error of AlexNet?", "what is the top 5 error of alexnet")
    assert not same_question("Fact 1 about AlexNet?", "Fact 2 about AlexNet?")
    assert is_near_duplicate("How many GPUs trained AlexNet?", "How many GPU's trained AlexNet?")


@pytest.mark.parametrize("jaccard, ratio", [(0.8, 0.9), (0.5, 0.7)])
def test_near_duplicates_index_drops_what_the_pairwise_rule_drops(jaccard: float, ratio: float) -> None:
    from opro.data.dataset import NearDuplicates, is_near_duplicate

    questions = [
        "What is the top-5 error of AlexNet?", "what's the TOP 5 error of alexnet", "?!", "Who wrote the paper?",
        "Who wrote the AlexNet paper?", "How many GPUs trained AlexNet?", "How many GPU's trained AlexNet ?",
        "Which activation does AlexNet use?", "What is the top-5 error of AlexNet?", "Why use dropout in AlexNet?",
        "Why is dropout used in AlexNet?", "When was AlexNet published?",
    ]
    index = NearDuplicates(jaccard=jaccard, ratio=ratio)
    kept: list[str] = []
    got, expected = [], []
    for q in questions:
        if not normalize_question(q):
            want = "empty"
        elif any(normalize_question(q) == normalize_question(k) for k in kept):
            want = "duplicate"
        elif any(is_near_duplicate(q, k, jaccard=jaccard, ratio=ratio) for k in kept):
            want = "near-duplicate"
        else:
            want = None
            kept.append(q)
        why = index.match(q)
        if why is None:
            index.add(q)
        got.append(why)
        expected.append(want)
    assert got == expected
    assert {"empty", "duplicate", "near-duplicate", None} <= set(got)


def test_split_keeps_a_shared_context_and_near_duplicates_in_one_split() -> None:
    from opro.data.dataset import related_groups, split_record

    topics = ["convolution", "dropout", "pooling", "momentum", "ImageNet", "GPUs", "ReLU", "LRN", "softmax",
              "augmentation", "weight decay", "batch size", "learning rate", "epochs", "filters"]
    examples: list[Example] = []
    for t in topics:  # two questions per chunk, as the generator makes them
        chunk = f"A paragraph of the paper about {t}."
        examples.append(Example(query=f"How does AlexNet use {t}?", reference_answer="a", reference_contexts=(chunk,)))
        examples.append(Example(query=f"Why was {t} chosen?", reference_answer="b", reference_contexts=(f"  {chunk}\n",)))
    examples.append(Example(query="What's the top-5 error of AlexNet?", reference_answer="c"))
    examples.append(Example(query="What is the top 5 error rate of AlexNet", reference_answer="c"))
    ds = GoldenDataset(tuple(examples))
    assert sorted(map(len, related_groups(ds.examples))) == [2] * 16
    for seed in range(6):
        split = make_split(ds.examples, exemplar=2, optimization=10, validation=6, heldout=None, seed=seed)
        where = {i: n for n in SPLIT_NAMES for i in split.indices(n)}
        for i in range(0, len(examples), 2):
            assert where[i] == where[i + 1], (seed, examples[i].query)
        assert make_split(ds.examples, exemplar=2, optimization=10, validation=6, heldout=None, seed=seed) == split
    record = split_record(ds.with_split(exemplar=2, optimization=10, validation=6, heldout=None, seed=0))
    assert [len(record["questions"][n]) for n in SPLIT_NAMES] == [2, 10, 6, 14]
    assert set(record["normalized"]) == {"exemplar", "optimization", "validation"}
    assert record != split_record(ds.with_split(exemplar=2, optimization=10, validation=6, heldout=None, seed=1))


def test_made_by_counts_who_wrote_the_questions_and_the_answers() -> None:
    from opro.data.dataset import Example, GoldenDataset

    llm = {"model_name": "qwen", "type": "ai"}
    ds = GoldenDataset(examples=(
        Example(query="a?", reference_answer="A.", query_by=llm, reference_answer_by={"type": "human"}),
        Example(query="b?", reference_answer="B.", query_by=llm),
        Example(query="c?", reference_answer="C."),
    ))
    assert ds.made_by() == {"questions": {"qwen (ai)": 2, "unknown": 1},
                            "answers": {"? (human)": 1, "unknown": 2}}
