from __future__ import annotations

import pytest

from opro.errors import PromptError
from opro.program.prompts import (
    DEFAULT_BASE_TEMPLATE,
    DEFAULT_INSTRUCTION,
    Demo,
    QATemplate,
    validate_instruction,
)


def test_defaults_match_the_reference_notebook() -> None:
    assert DEFAULT_BASE_TEMPLATE == "---------------------\n{context_str}\n---------------------\nQuery: {query_str}\nAnswer: "
    assert DEFAULT_INSTRUCTION == (
        "You are a QA assistant. Context information is below. Given the context information and not prior "
        "knowledge, answer the query."
    )
    t = QATemplate()
    assert t.instruction == DEFAULT_INSTRUCTION and t.position == "before"
    assert t.template_text == DEFAULT_INSTRUCTION + "\n" + DEFAULT_BASE_TEMPLATE


def test_format_before_and_after() -> None:
    before = QATemplate("Be brief.").format(context_str="CTX", query_str="Q?")
    assert before == "Be brief.\n---------------------\nCTX\n---------------------\nQuery: Q?\nAnswer: "
    after = QATemplate("Be brief.", position="after").format(context_str="CTX", query_str="Q?")
    assert after == "---------------------\nCTX\n---------------------\nQuery: Q?\nBe brief.\nAnswer: "


def test_after_position_shares_the_context_and_query_prefix() -> None:
    a = QATemplate("Answer in one word.", position="after").format(context_str="long context", query_str="What?")
    b = QATemplate("Think, then answer fully.", position="after").format(context_str="long context", query_str="What?")
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert a[:shared].endswith("Query: What?\n")


def test_llama_index_prompt_formats_identically() -> None:
    t = QATemplate('Reply as JSON like {"answer": "..."}.', position="after")
    li = t.to_llama_index()
    assert sorted(li.template_vars) == ["context_str", "query_str"]
    ctx, q = "a {weird} context", "what is {x}?"
    assert li.format(context_str=ctx, query_str=q) == t.format(context_str=ctx, query_str=q)


def test_values_with_braces_and_markers_are_inserted_literally() -> None:
    t = QATemplate("Be exact.")
    text = t.format(context_str="{query_str} and {context_str}", query_str="q {context_str}")
    assert "{query_str} and {context_str}" in text and "Query: q {context_str}" in text


@pytest.mark.parametrize(
    "bad, match",
    [
        ("Use {context_str} wisely.", "template variable"),
        ("Answer {name}.", "template variable"),
        ("Unbalanced { brace", "unmatched"),
        ("Closing } first {", "unmatched"),
        ("   ", "empty"),
    ],
)
def test_validate_instruction_rejects_template_breaking_text(bad: str, match: str) -> None:
    with pytest.raises(PromptError, match=match):
        validate_instruction(bad)
    with pytest.raises(PromptError):
        QATemplate(bad)


def test_validate_instruction_strips_and_allows_json_braces() -> None:
    assert validate_instruction("  Reply {\"a\": 1}.  ") == 'Reply {"a": 1}.'


def test_base_template_and_position_are_validated() -> None:
    with pytest.raises(PromptError, match=r"\{query_str\} exactly once"):
        QATemplate("x", base="{context_str} only")
    with pytest.raises(PromptError, match="unknown variable"):
        QATemplate("x", base="{context_str} {query_str} {other}")
    with pytest.raises(PromptError, match="position"):
        QATemplate("x", position="middle")  # type: ignore[arg-type]


def test_empty_instruction_is_the_base_alone() -> None:
    assert QATemplate("").template_text == DEFAULT_BASE_TEMPLATE


@pytest.mark.parametrize("position", ["before", "after"])
def test_from_template_text_round_trips(position: str) -> None:
    t = QATemplate('Cite the page {"p": 1}.', position=position)  # type: ignore[arg-type]
    assert QATemplate.from_template_text(t.template_text) == t


def test_from_template_text_reads_llama_index_default() -> None:
    from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT_TMPL

    t = QATemplate.from_template_text(DEFAULT_TEXT_QA_PROMPT_TMPL)
    assert t.base == DEFAULT_BASE_TEMPLATE
    assert t.instruction == (
        "Context information is below. Given the context information and not prior knowledge, answer the query."
    )
    custom = QATemplate.from_template_text("Docs: {context_str}\nQ: {query_str}\nA:")
    assert custom.instruction == "" and custom.base == "Docs: {context_str}\nQ: {query_str}\nA:"


@pytest.mark.parametrize("position", ["before", "after"])
def test_demonstrations_come_in_the_question_fields_before_the_question(position: str) -> None:
    """Each demonstration is the base template filled with its own context and question, then its
    answer; the instruction keeps its place around the real question; LlamaIndex formats the same."""
    demos = (Demo("Who won in {2012}?", "AlexNet won ImageNet 2012.", "AlexNet."), Demo("Q2?", "C2", "A2"))
    t = QATemplate("Be brief.", position=position, demos=demos)  # type: ignore[arg-type]
    text = t.format(context_str="CTX", query_str="Q?")
    first = "---------------------\nAlexNet won ImageNet 2012.\n---------------------\nQuery: Who won in {2012}?\nAnswer: AlexNet.\n\n"
    second = "---------------------\nC2\n---------------------\nQuery: Q2?\nAnswer: A2\n\n"
    plain = QATemplate("Be brief.", position=position).format(context_str="CTX", query_str="Q?")  # type: ignore[arg-type]
    if position == "before":
        assert text == "Be brief.\n" + first + second + plain.removeprefix("Be brief.\n")
    else:
        assert text == first + second + plain
    assert t.to_llama_index().format(context_str="CTX", query_str="Q?") == text
    assert t.with_instruction("Other.").demos == demos and QATemplate("").with_demos(demos[:1]).format(
        context_str="CTX", query_str="Q?").startswith(first)


@pytest.mark.parametrize("bad", [dict(query=""), dict(context="   "), dict(answer="see {query_str}")])
def test_a_demonstration_needs_text_in_every_field_and_no_template_variable(bad: dict[str, str]) -> None:
    fields = {"query": "q?", "context": "c", "answer": "a", **bad}
    with pytest.raises(PromptError, match="demonstration's"):
        Demo(**fields)


def test_a_configuration_round_trips_through_json_with_its_demos_and_settings() -> None:
    t = QATemplate(instruction="Answer.", position="after", settings={"top_k": 4, "answer_max_tokens": 64},
                   demos=(Demo(query="q?", context="c", answer="a"),))
    data = t.to_json()
    assert data["top_k"] == 4 and data["answer_max_tokens"] == 64 and data["demos"][0]["query"] == "q?"
    assert QATemplate.from_json(data) == t
    assert QATemplate(instruction="Answer.").to_json().keys() == {"instruction", "base", "position", "demos"}
    assert t.with_instruction("Other.").settings == {"top_k": 4, "answer_max_tokens": 64}  # kept
    with pytest.raises(PromptError, match="top_k must be a positive integer"):
        QATemplate(settings={"top_k": 0})
    with pytest.raises(PromptError, match=r"exported\.json: demos\[0\] has no text for answer"):
        QATemplate.from_json({"instruction": "x", "demos": [{"query": "q", "context": "c"}]}, where="exported.json")


@pytest.mark.parametrize("position", ["before", "after"])
def test_a_full_template_with_demonstrations_reads_back_exactly(position: str) -> None:
    t = QATemplate(instruction="Answer.", position=position, demos=(Demo(query="Who?", context="Ada wrote it.", answer="Ada."),))
    back = QATemplate.from_template_text(t.template_text)
    assert back.template_text == t.template_text  # the filled frame is not read as part of an instruction
    assert "Who?" not in back.instruction
