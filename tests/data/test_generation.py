from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from opro.data.generation import (
    DEFAULT_QUESTION_QUERY,
    generate_dataset,
    generate_examples,
    is_near_duplicate,
    parse_questions,
    says_not_in_context,
    select_chunks,
)
from opro.errors import ConfigError
from opro.llm import ChatClient, GenerationOptions, Message
from opro.llm.cache import CallCache
from opro.llm.scripted import ScriptedLLM
from opro.program.retrieval import Chunk

PAD = " This sentence pads the chunk to a realistic length for generation." * 4
CHUNKS = [
    Chunk(id="a", text="The Eiffel Tower was completed in 1889 for the World's Fair in Paris." + PAD),
    Chunk(id="b", text="Mount Fuji is an active volcano and the highest mountain in Japan." + PAD),
    Chunk(id="c", text="The Danube is the second-longest river in Europe." + PAD),
]


def _reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    prompt = messages[-1].content
    if "Teacher/Professor" in prompt:
        if "Eiffel" in prompt:
            return "Here are the questions:\n1. When was the Eiffel Tower completed?\n2. When was the Eiffel Tower completed?"
        if "Fuji" in prompt:
            return "1) What is the highest mountain in Japan?\n2) What is the highest mountain of Japan?\n3) Is Fuji active?"
        return "1. Which river is the second-longest in Europe?\n2. Who built the first bridge over the Danube?"
    query = re.search(r"Query: (.*)\nAnswer:", prompt)
    assert query is not None
    q = query.group(1)
    if "bridge" in q:
        return "The context does not provide information about who built the first bridge."
    return f"Answer to: {q}"


def test_generation_dedupes_and_drops_not_in_context_answers() -> None:
    llm = ScriptedLLM(default=_reply, model="strong-model")
    result = generate_examples(chunks=CHUNKS, llm=ChatClient(llm, role="generator"), questions_per_chunk=2, progress=False)
    ds = result.dataset
    assert [e.query for e in ds.examples] == [
        "When was the Eiffel Tower completed?",
        "What is the highest mountain in Japan?",
        "Which river is the second-longest in Europe?",
    ]
    assert sorted(d.reason for d in result.dropped) == ["duplicate", "near-duplicate", "not-in-context"]
    first = ds.examples[0]
    assert first.reference_contexts == (CHUNKS[0].text,)
    assert first.reference_answer == "Answer to: When was the Eiffel Tower completed?"
    assert first.query_by == {"model_name": "strong-model", "type": "ai"} == first.reference_answer_by
    # Prompt: the reference notebook's question query with the count filled in; temperature 0.
    question_prompt = llm.calls[0][0][-1].content
    assert DEFAULT_QUESTION_QUERY.replace("{num_questions_per_chunk}", "2") in question_prompt
    assert all(opts.temperature == 0.0 for _, opts in llm.calls)
    assert result.n_chunks == 3 and result.calls == 3 + 4


def test_a_chunks_answers_follow_its_questions_so_the_chunk_prefix_is_reused() -> None:
    """One call at a time (an in-process model): chunk a's questions, then its answers, then chunk b's
    questions... so each answer prompt starts where the question prompt of the same chunk left the KV
    cache. The dataset and the drops are those of asking every question first."""
    llm = ScriptedLLM(default=_reply, model="strong-model")
    llm.max_concurrency = 1
    result = generate_examples(chunks=CHUNKS, llm=ChatClient(llm, role="generator"), questions_per_chunk=2, progress=False)
    order = [("q" if "Teacher/Professor" in m[-1].content else "a") + next(
        c.id for c in CHUNKS if c.text in m[-1].content) for m, _ in llm.calls]
    assert order == ["qa", "aa", "qb", "ab", "qc", "ac", "ac"]
    assert [e.query for e in result.dataset.examples] == [
        "When was the Eiffel Tower completed?",
        "What is the highest mountain in Japan?",
        "Which river is the second-longest in Europe?",
    ]
    assert [d.reason for d in result.dropped] == ["duplicate", "near-duplicate", "not-in-context"]


def test_the_generation_bar_plans_its_calls_first_and_its_total_never_grows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its total is planned before the first call (a question call per chunk, an answer call per
    question asked) and falls by the answer calls a chunk does not need (duplicates, short replies):
    never "7/7 (100%)" then "8/9". The last line is the work done, at 100%."""
    import opro.progress

    monkeypatch.setattr(opro.progress, "LINE_EVERY_S", 0.0)  # a line per call
    llm = ScriptedLLM(default=_reply, model="strong-model")
    llm.max_concurrency = 1
    result = generate_examples(chunks=CHUNKS, llm=ChatClient(llm, role="generator"), questions_per_chunk=2)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("generating golden examples:")]
    counts = [tuple(map(int, m.groups())) for ln in lines
              if (m := re.match(r"generating golden examples: (\d+)/(\d+) ", ln))]
    totals = [total for _, total in counts]
    assert totals[0] == len(CHUNKS) * (1 + 2)
    assert all(b <= a for a, b in itertools.pairwise(totals)), totals
    assert all(done <= total for done, total in counts)
    assert counts[-1] == (result.calls, result.calls) and "(100%)" in lines[-1]


def test_rerun_is_free_with_the_cache(tmp_path: Path) -> None:
    llm = ScriptedLLM(default=_reply)
    cache = CallCache(tmp_path / "calls.sqlite")
    first = generate_dataset(chunks=CHUNKS, llm=ChatClient(llm, role="generator", cache=cache), progress=False)
    n_calls = len(llm.calls)
    again = generate_examples(chunks=CHUNKS, llm=ChatClient(llm, role="generator", cache=cache), progress=False)
    assert len(llm.calls) == n_calls and again.calls == 0
    assert again.dataset.content_hash == first.content_hash


def test_max_chunks_spreads_over_the_corpus_and_skips_short_chunks() -> None:
    chunks = [f"chunk {i} " + "x" * 300 for i in range(10)] + ["tiny"]
    picked = select_chunks(chunks, max_chunks=3)
    assert [i for i, _ in picked] == [0, 3, 6]
    assert all(i != 10 for i, _ in select_chunks(chunks, max_chunks=None))
    with pytest.raises(ConfigError, match="questions_per_chunk"):
        generate_examples(chunks=chunks, llm=ChatClient(ScriptedLLM(default="")), questions_per_chunk=0)


def test_parse_questions_handles_common_formats() -> None:
    text = 'Questions:\n1. What is X?\n2) Why Y?\n- How does Z work?\nQ4: Where is W?\n"What about V?"\nSome commentary.'
    assert parse_questions(text) == ["What is X?", "Why Y?", "How does Z work?", "Where is W?", "What about V?"]
    assert parse_questions(text, limit=2) == ["What is X?", "Why Y?"]
    assert parse_questions("1. **Explain the role of ReLU.**") == ["Explain the role of ReLU."]
    assert parse_questions("") == []


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("The context does not provide information about the author.", True),
        ("This is not mentioned in the context.", True),
        ("The given text doesn't specify the year.", True),
        ("I don't know.", True),
        ("The answer cannot be determined from the context.", True),
        ("AlexNet won the ImageNet challenge in 2012.", False),
        ("The context describes how dropout reduces overfitting.", False),
    ],
)
def test_says_not_in_context(answer: str, expected: bool) -> None:
    assert says_not_in_context(answer) is expected


def test_near_duplicates() -> None:
    assert is_near_duplicate("What is the highest mountain in Japan?", "what is the highest mountain of japan")
    assert not is_near_duplicate("What is the highest mountain in Japan?", "Which river flows through Vienna?")


@pytest.mark.embedded
def test_generation_on_the_embedded_strong_model(embedded_strong_llm: object, tmp_path: Path) -> None:
    from opro.llm import LLM

    assert isinstance(embedded_strong_llm, LLM)
    chunks = [
        "AlexNet is a convolutional neural network designed by Alex Krizhevsky with Ilya Sutskever and "
        "Geoffrey Hinton. It won the ImageNet Large Scale Visual Recognition Challenge in 2012 with a top-5 error "
        "of 15.3 percent, more than 10.8 percentage points lower than the runner up. The network used ReLU "
        "activations, dropout and was trained on two GPUs.",
        "The Python 'with' statement wraps the execution of a block with methods defined by a context manager. "
        "The context manager's __enter__() method is invoked before the block, and its __exit__() method is "
        "invoked after the block, even if the block raised an exception.",
    ]
    client = ChatClient(embedded_strong_llm, role="generator", cache=CallCache(tmp_path / "calls.sqlite"))
    result = generate_examples(chunks=chunks, llm=client, questions_per_chunk=1, answer_max_tokens=80, progress=False)
    assert result.n_chunks == 2
    assert len(result.dataset) >= 1, result.dropped
    for e in result.dataset.examples:
        assert e.query.strip() and e.reference_answer.strip()
        assert e.reference_contexts[0] in chunks
        assert e.query_by == {"model_name": embedded_strong_llm.model, "type": "ai"}
    rerun = generate_examples(chunks=chunks, llm=client, questions_per_chunk=1, answer_max_tokens=80, progress=False)
    assert rerun.calls == 0 and rerun.dataset == result.dataset


def test_cli_generate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from opro.cli import app
    from opro.data.dataset import load_dataset
    from opro.llm.pool import ModelPool, ModelSpec

    seen: list[ModelSpec] = []

    def fake_get(self: ModelPool, spec: ModelSpec) -> ScriptedLLM:
        seen.append(spec)
        return ScriptedLLM(default=_reply, model=spec.model)

    monkeypatch.setattr(ModelPool, "get", fake_get)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, c in enumerate(CHUNKS):
        (docs / f"doc{i}.txt").write_text(c.text, encoding="utf-8")
    (docs / "broken.pdf").write_bytes(b"garbage")
    out = tmp_path / "ds"
    runner = CliRunner()
    args = ["dataset", "generate", "--docs", str(docs), "--out", str(out), "--no-cache", "--exemplar", "1", "--seed", "5"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "broken.pdf" in res.output and "--skip-bad" in res.output
    res = runner.invoke(app, [*args, "--skip-bad"])
    assert res.exit_code == 0, res.output
    assert seen[-1].model == "qwen2.5-coder-1.5b-instruct" and seen[-1].backend == "llamacpp"
    ds = load_dataset(out)
    assert len(ds) == 3 and ds.split is not None and ds.split.seed == 5
    assert ds.split.sizes == {"exemplar": 1, "optimization": 1, "validation": 0, "heldout": 1}
    assert ds.examples[0].query_by == {"model_name": "qwen2.5-coder-1.5b-instruct", "type": "ai"}
