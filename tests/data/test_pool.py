"""`opro dataset pool`: more validation questions from the same documents, new against every split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opro.cli import app
from opro.data.dataset import load_dataset, normalize_question
from opro.data.pool import POOL_FILE, extension_questions, load_pool
from opro.data.questions import NearDuplicates
from opro.errors import DataError
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool, ModelSpec
from opro.llm.scripted import ScriptedLLM

PAD = " This sentence pads the chunk to a realistic length for generation." * 4
TEXTS = {
    "eiffel": "The Eiffel Tower was completed in 1889 for the World's Fair in Paris." + PAD,
    "fuji": "Mount Fuji is an active volcano and the highest mountain in Japan." + PAD,
    "danube": "The Danube is the second-longest river in Europe." + PAD,
}
AMAZON = "The Amazon flows from the Andes to the Atlantic and carries the most water of any river." + PAD


def _reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """The generator: two questions a chunk for the dataset; asked for three (the pool), the dataset's
    own again (a duplicate, a near-duplicate), one of another chunk's, and new ones."""
    prompt = messages[-1].content
    if "Teacher/Professor" in prompt:
        pool = "exactly 3 questions" in prompt
        if "Eiffel" in prompt:
            return ("1. When was the Eiffel Tower completed?\n2. Who designed the Eiffel Tower?\n3. How tall is the "
                    "Eiffel Tower?" if pool else "1. When was the Eiffel Tower completed?\n2. Where is the Eiffel Tower?")
        if "Fuji" in prompt:
            return ("1. What is the highest mountain of Japan?\n2. When did Mount Fuji last erupt?" if pool
                    else "1. What is the highest mountain in Japan?\n2. Is Mount Fuji an active volcano?")
        if "Danube" in prompt:
            return "1. Which river is the second-longest in Europe?\n2. Which capitals lie on the Danube?"
        return ("1. Where does the Amazon river rise?\n2. Which river is the second-longest in Europe?\n"
                "3. Which river carries the most water?")
    query = re.search(r"Query: (.*)\nAnswer:", prompt)
    assert query is not None
    return f"Answer to: {query.group(1)}"


@pytest.fixture
def generator(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_get(self: ModelPool, spec: ModelSpec) -> ScriptedLLM:
        return ScriptedLLM(default=_reply, model=spec.model)

    monkeypatch.setattr(ModelPool, "get", fake_get)


def _dataset(tmp_path: Path) -> tuple[Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in TEXTS.items():
        (docs / f"{name}.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "ds"
    args = ["dataset", "generate", "--docs", str(docs), "--out", str(out), "--no-cache", "--exemplar", "1",
            "--optimization", "2", "--validation", "1", "--heldout", "2", "--seed", "3"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    (docs / "amazon.txt").write_text(AMAZON, encoding="utf-8")  # a chunk no dataset question was asked of
    return docs, out


def test_the_pool_holds_new_questions_from_the_same_documents_none_equal_to_any_split_question(
    tmp_path: Path, generator: None,
) -> None:
    docs, out = _dataset(tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    dataset = load_dataset(out)
    assert len(dataset) == 6 and dataset.split is not None and len(dataset.examples_in("heldout")) == 2
    done = CliRunner().invoke(app, ["dataset", "pool", str(out), "--docs", str(docs), "--pool", "4",
                                    "--questions-per-chunk", "3", "--no-cache"])
    assert done.exit_code == 0, done.output
    pool = load_pool(out, dataset=dataset)
    # The unasked chunk first, then the dataset's own: the questions equal or near one of the dataset
    # (held-out ones included) dropped, four kept.
    assert [e.query for e in pool] == ["Where does the Amazon river rise?", "Which river carries the most water?",
                                       "Who designed the Eiffel Tower?", "How tall is the Eiffel Tower?"]
    assert pool[0].reference_contexts == (AMAZON,) and pool[0].reference_answer.startswith("Answer to: ")
    seen = NearDuplicates()
    for e in dataset.examples:
        seen.add(e.query)
    assert all(seen.match(e.query) is None for e in pool)
    assert not {normalize_question(e.query) for e in pool} & {normalize_question(e.query) for e in dataset.examples}
    assert "4 of 4 pool questions added" in done.output
    # The dataset and its split are as they were; the pool is a file beside them.
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != POOL_FILE} == before
    assert json.loads((out / POOL_FILE).read_text())["dataset_hash"] == dataset.content_hash
    # Asked again, the pool grows, new against its own questions too (the documents give one more).
    again = CliRunner().invoke(app, ["dataset", "pool", str(out), "--docs", str(docs), "--pool", "3",
                                     "--questions-per-chunk", "3", "--no-cache"])
    assert again.exit_code == 0, again.output
    grown = load_pool(out, dataset=dataset)
    assert grown[:4] == pool and [e.query for e in grown[4:]] == ["When did Mount Fuji last erupt?"]
    assert "1 of 3 pool questions added (the documents gave no more" in again.output
    # The extension asks the split's unused questions first, then the pool.
    assert extension_questions(dataset, out) == (*dataset.unused(), *grown)


@pytest.mark.parametrize(("args", "said"), [
    (["--pool", "-2"], "--pool must be at least 1 question, got -2"),
    (["--pool", "5"], "the pool is generated from the documents the dataset was made from: give them with --docs"),
])
def test_a_pool_of_no_questions_or_without_documents_is_refused_in_one_line(
    tmp_path: Path, generator: None, args: list[str], said: str,
) -> None:
    _, out = _dataset(tmp_path)
    done = CliRunner().invoke(app, ["dataset", "pool", str(out), *args])
    assert done.exit_code == 2 and said in done.output and "Traceback" not in done.output
    assert not (out / POOL_FILE).exists()


def test_a_pool_needs_usable_documents_and_a_split_dataset_folder_made_for_it(tmp_path: Path, generator: None) -> None:
    docs, out = _dataset(tmp_path)
    short = tmp_path / "short.txt"
    short.write_text("Too short to ask of.", encoding="utf-8")

    def pool(folder: Path, source: Path) -> str:
        done = CliRunner().invoke(app, ["dataset", "pool", str(folder), "--docs", str(source), "--pool", "2"])
        assert done.exit_code == 1 and "Traceback" not in done.output and not (folder / POOL_FILE).exists()
        return " ".join(done.output.split())

    assert "no chunk has at least 200 characters of text" in pool(out, short)
    assert "not an opro dataset folder" in pool(docs, docs)
    (out / "split.json").unlink()
    assert "has no split" in pool(out, docs) and "opro dataset split" in pool(out, docs)
    (out / POOL_FILE).write_text(json.dumps({"dataset_hash": "x" * 64, "examples": []}))
    with pytest.raises(DataError, match="made for other dataset contents"):
        load_pool(out, dataset=load_dataset(out))
