from __future__ import annotations

from pathlib import Path

import pytest

from opro.errors import PromptError
from opro.llm import ChatClient
from opro.llm.cache import CallCache
from opro.llm.scripted import ScriptedLLM
from opro.program.prompts import DEFAULT_BASE_TEMPLATE, QATemplate
from opro.program.rag import (
    TEXT_QA_KEY,
    QueryEngineProgram,
    RAGProgram,
    apply_template,
    as_llama_index_retriever,
    chat_client_llm,
    template_from_query_engine,
)
from opro.program.retrieval import Chunk, build_retriever

CHUNKS = [
    Chunk(id="c1", text="The Eiffel Tower is in Paris and was completed in 1889.", metadata={"page": 1}),
    Chunk(id="c2", text="Mount Fuji is the highest mountain in Japan.", metadata={"page": 2}),
    Chunk(id="c3", text="The Danube flows through Vienna and Budapest.", metadata={"page": 3}),
]


def _echo_llm() -> ScriptedLLM:
    # Replies with the first word after "Query:" so tests can see which prompt was sent.
    return ScriptedLLM(default=lambda msgs, opts: "ANSWER to " + msgs[-1].content.split("Query: ")[1].split("\n")[0])


def _program(llm: ScriptedLLM, tmp_path: Path | None = None, **kw: object) -> RAGProgram:
    cache = CallCache(tmp_path / "calls.sqlite") if tmp_path is not None else None
    return RAGProgram(retriever=build_retriever(chunks=CHUNKS, top_k=1), llm=ChatClient(llm, role="task", cache=cache), **kw)  # type: ignore[arg-type]


def test_answer_sends_one_user_message_with_context_query_and_instruction() -> None:
    llm = _echo_llm()
    program = _program(llm, max_tokens=64)
    template = QATemplate("Answer in one word.")
    ans = program.answer("When was the Eiffel Tower completed?", template=template)
    assert ans.text == "ANSWER to When was the Eiffel Tower completed?"
    assert [c.chunk_id for c in ans.contexts] == ["c1"]
    assert ans.completion.model == "scripted" and not ans.completion.cached
    messages, options = llm.calls[-1]
    assert len(messages) == 1 and messages[0].role == "user"
    assert messages[0].content == template.format(context_str=CHUNKS[0].text, query_str="When was the Eiffel Tower completed?")
    assert options.max_tokens == 64 and options.temperature == 0.0


def test_answer_many_keeps_order_and_uses_the_cache(tmp_path: Path) -> None:
    llm = _echo_llm()
    program = _program(llm, tmp_path)
    queries = ["Where is Mount Fuji?", "Which cities does the Danube flow through?", "Where is the Eiffel Tower?"]
    answers = program.answer_many(queries, template=QATemplate(), workers=3, progress=False)
    assert [a.query for a in answers] == queries
    assert [a.text for a in answers] == [f"ANSWER to {q}" for q in queries]
    again = program.answer_many(queries, template=QATemplate(), progress=False)
    assert all(a.completion.cached for a in again)
    assert len(llm.calls) == 3


def test_program_get_and_update_prompts() -> None:
    program = _program(_echo_llm())
    prompts = program.get_prompts()
    assert list(prompts) == [TEXT_QA_KEY]
    assert prompts[TEXT_QA_KEY].get_template() == QATemplate().template_text
    new = QATemplate("Reply tersely.", position="after")
    program.update_prompts({TEXT_QA_KEY: new.to_llama_index()})
    assert program.template == new
    assert "Reply tersely.\nAnswer: " in program.build_prompt("Where is Mount Fuji?")[0]
    with pytest.raises(PromptError, match="unknown prompt key"):
        program.update_prompts({"other": new.to_llama_index()})


def test_llama_index_query_engine_template_is_optimizable(tmp_path: Path) -> None:
    """A real RetrieverQueryEngine (llama-index-core), with opro's retriever and a ChatClient-backed LLM."""
    from llama_index.core.query_engine import RetrieverQueryEngine

    llm = _echo_llm()
    client = ChatClient(llm, role="task")
    engine = RetrieverQueryEngine.from_args(
        retriever=as_llama_index_retriever(build_retriever(chunks=CHUNKS, top_k=1)),
        llm=chat_client_llm(client, max_tokens=32),
    )
    # LlamaIndex's default QA template maps onto the notebook's base + its instruction sentences.
    start = template_from_query_engine(engine)
    assert start.base == DEFAULT_BASE_TEMPLATE
    assert start.instruction.startswith("Context information is below.")

    candidate = QATemplate("Answer with the year only.", position="after")
    apply_template(engine, candidate)
    assert template_from_query_engine(engine) == candidate
    response = engine.query("When was the Eiffel Tower completed?")
    assert str(response) == "ANSWER to When was the Eiffel Tower completed?"
    sent = llm.calls[-1][0][-1].content
    assert sent == candidate.format(context_str=CHUNKS[0].text, query_str="When was the Eiffel Tower completed?")
    assert client.usage.snapshot()["task"].calls == 1

    program = QueryEngineProgram(engine)
    assert program.template == candidate
    ans = program.answer("Where is Mount Fuji?", template=QATemplate("Be brief."))
    assert ans.text == "ANSWER to Where is Mount Fuji?"
    assert [c.chunk_id for c in ans.contexts] == ["c2"]
    assert llm.calls[-1][0][-1].content.startswith("Be brief.\n---------------------\n")
    answers = program.answer_many(["Where is Mount Fuji?"], progress=False)
    assert answers[0].text == "ANSWER to Where is Mount Fuji?"


def test_the_llm_metadata_is_built_once_per_setting_and_follows_a_changed_one() -> None:
    # LlamaIndex reads an LLM's metadata several times per query: opro's LLM keeps it instead of building it
    # each time (a cost per answer in a user's engines), and a changed max_tokens is seen.
    llm = chat_client_llm(ChatClient(ScriptedLLM(default="x", model="m"), role="task"), max_tokens=32)
    first = llm.metadata
    assert llm.metadata is first and (first.num_output, first.model_name, first.context_window) == (32, "m", 4096)
    llm.max_tokens = 64
    assert llm.metadata.num_output == 64 and llm.metadata is not first


def test_program_as_query_engine_round_trip() -> None:
    llm = _echo_llm()
    program = _program(llm, template=QATemplate("Use the context."))
    engine = program.as_query_engine()
    assert template_from_query_engine(engine) == program.template
    assert str(engine.query("Where is Mount Fuji?")) == "ANSWER to Where is Mount Fuji?"
    assert llm.calls[-1][0][-1].content == program.build_prompt("Where is Mount Fuji?")[0]


def test_a_templates_settings_choose_its_chunks_and_answer_length_in_a_batch_too(tmp_path: Path) -> None:
    from opro.llm import ChatClient, UsageLedger
    from opro.llm.scripted import ScriptedLLM
    from opro.program.prompts import QATemplate
    from opro.program.rag import RAGProgram
    from opro.program.retrieval import RetrievedContext

    class Counting:
        def __init__(self) -> None:
            self.calls: list[int | None] = []

        def retrieve(self, query: str, *, top_k: int | None = None) -> list[RetrievedContext]:
            self.calls.append(top_k)
            return [RetrievedContext(text=f"chunk {i}", score=1.0) for i in range(top_k or 2)]

    llm = ScriptedLLM(default="ok")
    retriever = Counting()
    program = RAGProgram(retriever=retriever, llm=ChatClient(llm, role="task", usage=UsageLedger()),  # type: ignore[arg-type]
                         max_tokens=100)
    plain, wide, short = QATemplate(), QATemplate(settings={"top_k": 3}), QATemplate(settings={"answer_max_tokens": 7})
    answers = program.answer_group("q?", templates=[plain, wide, short])
    assert [len(a.contexts) for a in answers] == [2, 3, 2]  # type: ignore[union-attr]
    assert sorted(retriever.calls, key=str) == [3, None]  # once per top_k
    assert [o.max_tokens for _, o in llm.calls] == [100, 100, 7]
    assert "chunk 2" in llm.calls[1][0][-1].content and "chunk 2" not in llm.calls[0][0][-1].content


def test_a_template_with_its_own_chunking_is_answered_from_that_chunkings_retriever() -> None:
    from opro.llm import UsageLedger
    from opro.program.retrieval import RetrievedContext

    class Named:
        def __init__(self, name: str) -> None:
            self.name, self.calls = name, 0

        def retrieve(self, query: str, *, top_k: int | None = None) -> list[RetrievedContext]:
            self.calls += 1
            return [RetrievedContext(text=f"{self.name} chunk", score=1.0)]

    own, by_size = Named("own"), {256: Named("256")}
    llm = ScriptedLLM(default="ok")
    program = RAGProgram(retriever=own, llm=ChatClient(llm, role="task", usage=UsageLedger()),  # type: ignore[arg-type]
                         chunked=lambda size: by_size[size])  # type: ignore[arg-type,return-value]
    small, plain = QATemplate(settings={"chunk_size": 256}), QATemplate()
    assert [c.text for c in program.answer("q?", template=small).contexts] == ["256 chunk"]
    answers = program.answer_group("q?", templates=[plain, small, small.with_instruction("Say it.")])
    assert [a.contexts[0].text for a in answers] == ["own chunk", "256 chunk", "256 chunk"]  # type: ignore[union-attr]
    assert (own.calls, by_size[256].calls) == (1, 2)  # once per chunking in a group
    single = RAGProgram(retriever=own, llm=ChatClient(llm, role="task", usage=UsageLedger()))  # type: ignore[arg-type]
    with pytest.raises(PromptError, match=r"chunk_size = 256.*one index"):
        single.answer("q?", template=small)
