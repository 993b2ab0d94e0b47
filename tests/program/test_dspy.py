"""DSPy on opro's models: the LM adapter caches and counts calls, the RAG module asks exactly what
opro's RAG program asks, and the judge metric gives DSPy a score and GEPA its feedback."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from fakes import Ex

dspy = pytest.importorskip("dspy")

from opro.errors import ConfigError  # noqa: E402
from opro.judges import CorrectnessJudge  # noqa: E402
from opro.judges.metrics import MetricResult  # noqa: E402
from opro.llm import ChatClient, GenerationOptions, Message, UsageLedger  # noqa: E402
from opro.llm.cache import CallCache  # noqa: E402
from opro.llm.scripted import ScriptedLLM  # noqa: E402
from opro.program.dspy import OproLM, OproRAG, ScoreLog, judge_metric, to_dspy_examples  # noqa: E402
from opro.program.prompts import Demo, QATemplate  # noqa: E402
from opro.program.rag import RAGProgram  # noqa: E402
from opro.program.retrieval import RetrievedContext  # noqa: E402


class _Retriever:
    def retrieve(self, query: str) -> list[RetrievedContext]:
        return [RetrievedContext(text=f"Context about {query}", score=1.0, metadata={}, chunk_id="c1")]

    def describe(self) -> dict[str, str]:
        return {"kind": "fixed"}


def _client(tmp_path: Path, llm: ScriptedLLM, role: str = "task", usage: UsageLedger | None = None) -> ChatClient:
    return ChatClient(llm, role=role, cache=CallCache(tmp_path / "calls.sqlite"), usage=usage or UsageLedger())


def test_the_lm_adapter_caches_and_counts_calls_in_opros_ledger(tmp_path: Path) -> None:
    llm = ScriptedLLM(default="[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]")
    ledger = UsageLedger()
    lm = OproLM(_client(tmp_path, llm, usage=ledger), max_tokens=32)
    predict = dspy.Predict("question -> answer")
    with dspy.context(lm=lm):
        first = predict(question="Capital of France?")
        second = predict(question="Capital of France?")
    assert first.answer == second.answer == "Paris"
    assert len(llm.calls) == 1  # the second call was answered by opro's cache (DSPy's own cache is off)
    usage = ledger.snapshot()["task"]
    assert (usage.calls, usage.cache_hits) == (1, 1)
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert llm.calls[0][1].max_tokens == 32 and llm.calls[0][1].temperature == 0.0


def test_several_samples_are_distinct_calls_and_reproducible(tmp_path: Path) -> None:
    llm = ScriptedLLM(default=lambda m, o: f"sample seed {o.seed}")
    first = _client(tmp_path, llm)
    samples = OproLM(first, temperature=1.0)("Propose an instruction.", n=3)
    assert len(set(samples)) == 3
    assert first.cache is not None
    first.cache.close()  # a finished run commits its cache's queued writes
    again = OproLM(_client(tmp_path, llm), temperature=1.0)("Propose an instruction.", n=3)
    assert again == samples and len(llm.calls) == 3  # a fresh run replays them from the cache


def test_the_rag_module_asks_exactly_what_opros_program_asks(tmp_path: Path) -> None:
    llm = ScriptedLLM(default="Forty-two.")
    client = _client(tmp_path, llm)
    program = RAGProgram(retriever=_Retriever(), llm=client, max_tokens=48)  # type: ignore[arg-type]
    instruction = "Answer in one short sentence."
    opro_answer = program.answer("What is the answer?", template=program.template.with_instruction(instruction))
    module = OproRAG(program, instruction=instruction)
    pred = module(question="What is the answer?")
    assert pred.answer == opro_answer.text == "Forty-two."
    assert pred.instruction == instruction
    assert len(llm.calls) == 1  # the DSPy call hit the cache entry of opro's call: the same prompt
    # Only the instruction varies: a changed one is a new prompt with the same frame.
    module.generate.signature = module.generate.signature.with_instructions("Answer tersely.")
    module(question="What is the answer?")
    prompt = llm.calls[-1][0][-1].content
    assert prompt.startswith("Answer tersely.") and "Context about What is the answer?" in prompt
    assert prompt.replace("Answer tersely.", instruction) == llm.calls[0][0][-1].content


def test_the_rag_module_shows_demos_in_their_own_fields_as_opros_program_does(tmp_path: Path) -> None:
    llm = ScriptedLLM(default="Forty-two.")
    client = _client(tmp_path, llm)
    demo = Demo(query="Who wrote it?", context="It was written by Ada.", answer="Ada.")
    template = QATemplate(instruction="Answer briefly.", demos=(demo,), settings={"answer_max_tokens": 16})
    program = RAGProgram(retriever=_Retriever(), llm=client, max_tokens=48, template=template)  # type: ignore[arg-type]
    opro_answer = program.answer("What is the answer?")
    pred = OproRAG(program, instruction="Answer briefly.")(question="What is the answer?")
    assert pred.answer == opro_answer.text
    assert len(llm.calls) == 1  # one cache entry: the same prompt, demonstration included, and max_tokens
    prompt, options = llm.calls[0][0][-1].content, llm.calls[0][1]
    assert prompt.index("Who wrote it?") < prompt.rindex("Ada.") < prompt.index("What is the answer?")
    assert options.max_tokens == 16
    module = OproRAG(program, instruction="Answer.")
    module.generate.demos = [dspy.Example(question="q", answer="a")]  # a labeled demo without its context
    with pytest.raises(ConfigError, match="0 labeled demos"):
        module(question="q")


def _judge(tmp_path: Path, reply: str) -> CorrectnessJudge:
    return CorrectnessJudge(_client(tmp_path, ScriptedLLM(default=reply), role="judge"))


def test_the_judge_metric_gives_a_unit_score_and_gepa_feedback(tmp_path: Path) -> None:
    judge = _judge(tmp_path, json.dumps({"score": 2, "reasoning": "It names the wrong year."}))
    example = to_dspy_examples([Ex("When?", "2012.")])[0]
    pred = dspy.Prediction(answer="In 2010.", instruction="Answer.")
    log = ScoreLog()
    assert judge_metric(judge, log=log)(example, pred) == pytest.approx(0.25)  # (2 - 1) / 4
    fb = judge_metric(judge, feedback=True)(example, pred)
    assert fb.score == pytest.approx(0.25)
    assert "It names the wrong year." in fb.feedback and "2 of 5" in fb.feedback
    assert log.entries[0].score == 2.0 and log.entries[0].instruction == "Answer."
    assert log.best(["When?"]) == ("Answer.", 2.0, 1)


def test_an_unreadable_judgment_scores_zero_and_says_why(tmp_path: Path) -> None:
    judge = _judge(tmp_path, "I cannot decide.")
    example = dspy.Example(question="When?", answer="2012.").with_inputs("question")
    fb = judge_metric(judge, feedback=True)(example, dspy.Prediction(answer="2012."))
    assert fb.score == 0.0 and "could not be read" in fb.feedback


def test_structured_output_reaches_the_backend_as_a_json_schema(tmp_path: Path) -> None:
    def reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        assert options.json_schema is not None
        return json.dumps({name: "ok" for name in json.loads(options.json_schema)["properties"]})

    lm = OproLM(_client(tmp_path, ScriptedLLM(default=reply)))
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        assert dspy.Predict("question -> answer")(question="q").answer == "ok"


def test_the_judge_metric_takes_any_metric_through_measure() -> None:
    class Graded:
        """A Metric with no ``evaluate``: the adapter must go through the protocol."""

        name = "graded"

        def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> MetricResult:
            return MetricResult(name=self.name, score=5.0 if answer == reference else 1.0, passing=None)

    example = dspy.Example(question="When?", answer="2012.").with_inputs("question")
    assert judge_metric(Graded())(example, dspy.Prediction(answer="2012.")) == 1.0
    assert judge_metric(Graded())(example, dspy.Prediction(answer="2010.")) == 0.0
