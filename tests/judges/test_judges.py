from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import require_shared_alexnet

from opro.errors import ConfigError, PromptError
from opro.judges import (
    BUILTIN_TEMPLATES,
    CorrectnessJudge,
    FaithfulnessJudge,
    JudgeTemplate,
    RelevancyJudge,
    correctness_schema,
    expected_score_from_logprobs,
    get_template,
    pack_contexts,
    parse_score,
    parse_yes_no,
)
from opro.llm import LLM, ChatClient, Completion, GenerationOptions, Message
from opro.llm.scripted import ScriptedLLM

# (reply, expected score or None) — replies as small judges really write them.
PARSER_TABLE = [
    ("4.0\nThe generated answer matches the reference.", 4.0),
    ("5", 5.0),
    # Leading newline: LlamaIndex's default_parser reads "" as the score line and returns None.
    ("\n4\nThe answer is correct but wordy.", 4.0),
    # Score after reasoning: default_parser fails on the first line.
    ("The answer is relevant but misses the year.\n3", 3.0),
    ("Score: 5/5\nPerfect match.", 5.0),
    ("Score: 4", 4.0),
    ("**Score:** 4\n**Reasoning:** mostly right.", 4.0),
    ("**Score**: 2", 2.0),
    ("Feedback: The response is correct but incomplete. [RESULT] 3", 3.0),
    ("Feedback: A reference answer gets Score 5; this one misses facts. [RESULT] (2)", 2.0),
    ('{"score": 4, "reasoning": "Same facts as the reference."}', 4.0),
    ('{"reasoning": "Wrong year.", "score": 2}', 2.0),
    ('```json\n{"score": 5, "reasoning": "ok"}\n```', 5.0),
    ('{"score": 3, "reasoning": "cut off by max_tok', 3.0),  # truncated JSON keeps its score
    ("4.5\nAlmost perfect.", 4.5),
    ("Score: 2\nOn reflection the answer is better.\nFinal score: 2", 2.0),  # same verdict twice
    ("Score: 2\nIt misses the year; a fully correct answer would get a score of 5.", 2.0),
    ('Score: 1\nA perfect answer, e.g. {"score": 5}, names the year.', None),  # two scores: invalid
    ("Score: 2\nOn reflection the answer is better.\nFinal score: 3", None),  # changed its mind
    ("The answer gets a score of 4.", None),  # prose, not a label
    ("Rating: 3 out of 5", 3.0),
    ("**4**", 4.0),
    # Invalid: out of range, other scale, no score, empty.
    ("7\nGreat answer.", None),
    ("0", None),
    ("Score: 8/10", None),
    ('{"score": 6, "reasoning": "x"}', None),
    ("The generated answer is relevant and correct.", None),
    ("", None),
    ("   \n  ", None),
    ('{"score": "high", "reasoning": "x"}', None),
]


@pytest.mark.parametrize(("reply", "expected"), PARSER_TABLE)
def test_parse_score_table(reply: str, expected: float | None) -> None:
    parsed = parse_score(reply)
    assert parsed.score == expected
    if expected is None:
        assert parsed.reason  # says why


def test_parse_score_reasoning_and_reason_texts() -> None:
    assert parse_score('{"score": 4, "reasoning": "Same facts."}').reason == "Same facts."
    assert parse_score("4.0\nSame facts.").reason == "Same facts."
    assert "outside 1..5" in parse_score("7").reason
    assert "no score" in parse_score("fine answer").reason
    assert parse_score("").reason == "empty reply"


def test_score_first_hint_trusts_first_line() -> None:
    reply = "4\nThe reference answer would get\n5"
    assert parse_score(reply, output_format="score_first").score == 4.0
    assert parse_score(reply).score == 5.0  # without the hint, the final verdict


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtin_templates_render(name: str) -> None:
    template = BUILTIN_TEMPLATES[name]
    msgs = template.render(query="Who won ImageNet 2012?", answer="AlexNet {x}", reference="AlexNet won.")
    assert msgs[0].role == "system" and msgs[-1].role == "user"
    text = "\n".join(m.content for m in msgs)
    assert "Who won ImageNet 2012?" in text and "AlexNet {x}" in text and "AlexNet won." in text
    assert "{query}" not in text and "{generated_answer}" not in text and "{reference_answer}" not in text


def test_llamaindex_template_is_verbatim() -> None:
    from llama_index.core.evaluation.correctness import DEFAULT_SYSTEM_TEMPLATE, DEFAULT_USER_TEMPLATE

    t = BUILTIN_TEMPLATES["llamaindex"]
    assert t.system == DEFAULT_SYSTEM_TEMPLATE and t.user == DEFAULT_USER_TEMPLATE


def test_prometheus_and_fewshot_shapes() -> None:
    p = BUILTIN_TEMPLATES["prometheus"].render(query="q", answer="a", reference="r")[-1].content
    assert "Reference answer (scores 5): r" in p and "[RESULT]" in p
    assert all(f"Score {i}:" in p for i in range(1, 6))
    f = BUILTIN_TEMPLATES["fewshot"].system
    assert all(f"-> Score: {i}" in f for i in range(1, 6))
    assert len(f) < 1500  # kept short for the CPU judge
    r = BUILTIN_TEMPLATES["rubric"]
    assert all(f"{i} = " in r.system for i in range(1, 6)) and "different question" in r.system
    assert len(r.system) + len(r.user) < 800  # paid on every candidate and question


def test_missing_reference_placeholder_text() -> None:
    msgs = BUILTIN_TEMPLATES["llamaindex"].render(query="q", answer="a", reference=None)
    assert "(NO REFERENCE ANSWER SUPPLIED)" in msgs[-1].content


def test_custom_templates(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="generated_answer"):
        JudgeTemplate("bad", "sys", "Q: {query}")
    toml = tmp_path / "mine.toml"
    toml.write_text(
        'system = "Grade."\nuser = "Q: {query}\\nA: {generated_answer}"\noutput_format = "score_label"\n'
    )
    t = get_template(toml)
    assert t.name == "mine" and t.output_format == "score_label"
    txt = tmp_path / "plain.txt"
    txt.write_text('Q: {query} R: {reference_answer} A: {generated_answer} JSON like {"score": 1}')
    t2 = get_template(str(txt))
    rendered = t2.render(query="q", answer="a", reference="r")
    assert rendered == (Message("user", 'Q: q R: r A: a JSON like {"score": 1}'),)
    bad = tmp_path / "bad.toml"
    bad.write_text('sistem = "x"\n')
    with pytest.raises(ConfigError, match="user"):
        get_template(bad)
    with pytest.raises(ConfigError, match="unknown judge template"):
        get_template("nonexistent-template")


def _client(llm: LLM) -> ChatClient:
    return ChatClient(llm, role="judge")


def test_judge_structured_uses_schema_and_parses() -> None:
    llm = ScriptedLLM(default='{"score": 4, "reasoning": "Matches."}')
    judge = CorrectnessJudge(_client(llm))
    r = judge.evaluate(query="q", answer="a", reference="r")
    assert (r.score, r.passing, r.feedback, r.invalid) == (4.0, True, "Matches.", False)
    _, options = llm.calls[0]
    assert options.temperature == 0.0
    assert json.loads(options.json_schema or "{}") == correctness_schema(reasoning_first=False)
    assert "Respond only with a JSON object" in llm.calls[0][0][-1].content


def test_reasoning_first_schema_order() -> None:
    schema = correctness_schema(reasoning_first=True)
    assert list(schema["properties"]) == ["reasoning", "score"]
    assert schema["properties"]["score"]["enum"] == [1, 2, 3, 4, 5]


class _PlainLLM(ScriptedLLM):
    supports_json_schema = False


def test_judge_unstructured_backend_uses_template_format() -> None:
    llm = _PlainLLM(default="\n3\nRelevant but wrong year.")
    judge = CorrectnessJudge(_client(llm), threshold=3.5)
    r = judge.evaluate(query="q", answer="a", reference="r")
    assert r.score == 3.0 and r.passing is False
    assert llm.calls[0][1].json_schema is None
    assert "JSON" not in llm.calls[0][0][-1].content


def test_invalid_reply_is_invalid_not_zero() -> None:
    judge = CorrectnessJudge(_client(_PlainLLM(default="I cannot grade this.")))
    r = judge.evaluate(query="q", answer="a", reference="r")
    assert r.invalid and r.score is None and r.passing is None
    assert "no score" in (r.invalid_reason or "")


def test_empty_answer_scores_lowest_without_a_call() -> None:
    llm = ScriptedLLM(default="5")
    r = CorrectnessJudge(_client(llm)).evaluate(query="q", answer="  ", reference="r")
    assert r.score == 1.0 and not r.invalid and llm.calls == []


def test_judge_config_errors() -> None:
    with pytest.raises(ConfigError, match="threshold"):
        CorrectnessJudge(_client(ScriptedLLM()), threshold=7)
    with pytest.raises(ConfigError, match="unknown judge template"):
        CorrectnessJudge(_client(ScriptedLLM()), template="gpt-judge")


def test_aevaluate() -> None:
    judge = CorrectnessJudge(_client(ScriptedLLM(default='{"score": 2, "reasoning": "wrong"}')))
    r = asyncio.run(judge.aevaluate(query="q", answer="a", reference="r"))
    assert r.score == 2.0 and r.passing is False


class _LogprobLLM(LLM):
    """Returns a fixed JSON reply with per-token top logprobs."""

    provider = "fake"
    supports_json_schema = True
    supports_logprobs = True

    def __init__(self, tokens: list[dict[str, float]]) -> None:
        self.tokens = tokens
        self.options: GenerationOptions | None = None

    @property
    def model(self) -> str:
        return "fake"

    def generate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        self.options = options
        text = "".join(max(t, key=lambda k: t[k]) for t in self.tokens)
        return Completion(text=text, model="fake", top_logprobs=tuple(self.tokens))


def test_expected_score_from_logprobs() -> None:
    lp = math.log
    tokens = [
        {'{"': 0.0},
        {"score": 0.0},
        {'":': 0.0},
        {" ": 0.0},
        {"4": lp(0.6), "5": lp(0.3), "3": lp(0.05), "x": lp(0.05)},
        {', "reasoning": "ok"}': 0.0},
    ]
    llm = _LogprobLLM(tokens)
    judge = CorrectnessJudge(_client(llm), expected_score=True)
    r = judge.evaluate(query="q", answer="a", reference="r")
    assert llm.options is not None and llm.options.top_logprobs == 5
    assert r.score == 4.0
    # (0.6*4 + 0.3*5 + 0.05*3) / 0.95
    assert r.expected_score == pytest.approx((2.4 + 1.5 + 0.15) / 0.95)


def test_expected_score_absent_without_logprobs() -> None:
    assert expected_score_from_logprobs(Completion(text="4", model="m"), 0, 4.0) is None
    judge = CorrectnessJudge(
        _client(ScriptedLLM(default='{"score": 4, "reasoning": "x"}')), expected_score=True
    )
    assert judge.evaluate(query="q", answer="a", reference="r").expected_score is None


def test_parse_yes_no() -> None:
    assert parse_yes_no("YES") is True
    assert parse_yes_no("no, the context says otherwise") is False
    assert parse_yes_no('{"answer": "YES"}') is True
    assert parse_yes_no("Maybe.") is None
    assert parse_yes_no("No doubt about it: YES") is True
    assert parse_yes_no("Verdict: NO because the context never names the year.") is False
    assert parse_yes_no("YES.\nOn second thought: NO") is None  # two verdicts: invalid


def test_pack_contexts() -> None:
    assert pack_contexts(["aaaa", "bbbb", "", "cccc"], max_chars=10) == ["aaaa\n\nbbbb", "cccc"]
    assert pack_contexts([], max_chars=10) == []


def test_faithfulness_create_and_refine_stops_at_yes() -> None:
    llm = _PlainLLM(replies=["NO", "YES"], default="NO")
    judge = FaithfulnessJudge(_client(llm), max_context_chars=5)
    r = judge.evaluate(answer="AlexNet won in 2012.", contexts=["ctx one", "ctx two", "ctx three"])
    assert r.score == 1.0 and r.passing is True
    assert len(llm.calls) == 2  # the third context is not needed once the answer is YES
    assert "Information: AlexNet won in 2012." in llm.calls[0][0][-1].content
    assert "existing YES/NO answer: NO" in llm.calls[1][0][-1].content
    assert "ctx two" in llm.calls[1][0][-1].content


def test_relevancy_no_and_invalid() -> None:
    judge = RelevancyJudge(_client(_PlainLLM(default="NO")))
    r = judge.evaluate(query="Who?", answer="Him.", contexts=["c1", "c2"])
    assert r.score == 0.0 and r.passing is False and not r.invalid
    bad = RelevancyJudge(_client(_PlainLLM(default="Hmm.")))
    assert bad.evaluate(query="Who?", answer="Him.", contexts=["c"]).invalid
    assert bad.evaluate(query="Who?", answer="Him.", contexts=[]).invalid


def test_yes_no_structured_schema() -> None:
    llm = ScriptedLLM(default='{"answer": "YES"}')
    r = FaithfulnessJudge(_client(llm)).evaluate(answer="a", contexts=["c"])
    assert r.passing is True and llm.calls[0][1].json_schema is not None
    assert (
        asyncio.run(RelevancyJudge(_client(llm)).aevaluate(query="q", answer="a", contexts=["c"])).score
        == 1.0
    )


DATASET = Path(__file__).parents[2].parent / "shared/data/history_of_alexnet/rag_dataset.json"


@pytest.mark.embedded
def test_embedded_judge_separates_right_from_wrong(embedded_strong_llm: LLM) -> None:
    """The real 1.5B judge: a reference answer scores high, another question's reference scores low."""
    examples = json.loads((require_shared_alexnet() / "rag_dataset.json").read_text(encoding="utf-8"))["examples"]
    # Short references keep the two calls quick on CPU: pooling operations vs an RNN-applications answer.
    right, other = examples[28], examples[140]
    judge = CorrectnessJudge(ChatClient(embedded_strong_llm, role="judge"))
    good = judge.evaluate(
        query=right["query"], answer=right["reference_answer"], reference=right["reference_answer"]
    )
    bad = judge.evaluate(
        query=right["query"], answer=other["reference_answer"], reference=right["reference_answer"]
    )
    assert not good.invalid and not bad.invalid  # the JSON schema makes replies parseable
    assert good.score is not None and good.score >= 4, good
    assert bad.score is not None and bad.score <= 2, bad
    assert good.passing and not bad.passing


def test_schema_property_order_reaches_the_backend() -> None:
    # Grammar-constrained backends generate properties in schema order: the client must not sort them.
    llm = ScriptedLLM(default='{"score": 4, "reasoning": "x"}')
    CorrectnessJudge(_client(llm)).evaluate(query="q", answer="a", reference="r")
    sent = json.loads(llm.calls[0][1].json_schema or "{}")
    assert list(sent["properties"]) == ["score", "reasoning"]


def test_an_unreadable_judge_reply_is_not_replayed_from_the_cache(tmp_path: Path) -> None:
    from opro.llm.cache import CallCache

    replies = iter(["I cannot decide.", '{"score": 4, "reasoning": "Matches."}'])
    llm = ScriptedLLM(default=lambda messages, options: next(replies))
    cache = CallCache(tmp_path / "calls.sqlite")
    judge = CorrectnessJudge(ChatClient(llm, role="judge", cache=cache))
    first = judge.evaluate(query="q", answer="a", reference="r")
    assert first.invalid and len(cache) == 0  # the unreadable reply was not kept as a success
    second = judge.evaluate(query="q", answer="a", reference="r")
    assert second.score == 4 and len(cache) == 1
    third = judge.evaluate(query="q", answer="a", reference="r")  # a readable reply is replayed
    assert third.score == 4 and len(cache) == 1
    cache.close()


@pytest.mark.parametrize("kind", ["faithfulness", "relevancy"])
def test_an_unreadable_yes_no_reply_is_not_replayed_from_the_cache(tmp_path: Path, kind: str) -> None:
    """Issue 40, item 7: the yes/no judges kept unreadable replies in the call cache, so after the
    endpoint was mended `compare --metrics faithfulness` sent nothing and still showed n/a."""
    from opro.llm.cache import CallCache

    replies = iter(["Hmm.", "YES", "YES"])
    llm = ScriptedLLM(default=lambda messages, options: next(replies))
    cache = CallCache(tmp_path / "calls.sqlite")
    judge = (FaithfulnessJudge if kind == "faithfulness" else RelevancyJudge)(ChatClient(llm, role="judge", cache=cache))

    def ask() -> object:
        if kind == "faithfulness":
            return judge.evaluate(answer="a", contexts=["c"])  # type: ignore[call-arg]
        return judge.evaluate(query="q", answer="a", contexts=["c"])  # type: ignore[call-arg]

    first = ask()
    assert first.invalid and len(cache) == 0  # type: ignore[attr-defined]
    second = ask()
    assert second.passing and len(cache) == 1  # type: ignore[attr-defined]
    assert ask().passing and len(llm.calls) == 2  # type: ignore[attr-defined]  # the readable reply is replayed
    cache.close()


# --- prompts that come from the library that owns them ------------------------------------------------


def test_llamaindex_templates_in_use_are_the_librarys_objects() -> None:
    from llama_index.core.evaluation import correctness, dataset_generation, faithfulness, relevancy
    from llama_index.core.prompts import default_prompts

    import opro.data.generation as generation
    import opro.judges.templates as judges

    li = BUILTIN_TEMPLATES["llamaindex"]
    assert li.system == correctness.DEFAULT_SYSTEM_TEMPLATE  # read from the installed source, not copied
    assert li.user == correctness.DEFAULT_USER_TEMPLATE
    assert FaithfulnessJudge(_client(ScriptedLLM())).eval_template == faithfulness.DEFAULT_EVAL_TEMPLATE.template
    assert FaithfulnessJudge(_client(ScriptedLLM())).refine_template == faithfulness.DEFAULT_REFINE_TEMPLATE.template
    assert RelevancyJudge(_client(ScriptedLLM())).eval_template == relevancy.DEFAULT_EVAL_TEMPLATE.template
    assert RelevancyJudge(_client(ScriptedLLM())).refine_template == relevancy.DEFAULT_REFINE_TEMPLATE.template
    assert relevancy.DEFAULT_REFINE_TEMPLATE.template == judges.RELEVANCY_REFINE
    assert generation.DEFAULT_ANSWER_TEMPLATE is default_prompts.DEFAULT_TEXT_QA_PROMPT_TMPL
    assert generation._LI_QUESTION_PROMPT is dataset_generation.DEFAULT_QUESTION_GENERATION_PROMPT
    assert generation.DEFAULT_QUESTION_TEMPLATE.startswith(dataset_generation.DEFAULT_QUESTION_GENERATION_PROMPT)


# --- the logit judge: the score read at the score position ---------------------------------------------


def _choices_llm(probs: dict[str, float]) -> ScriptedLLM:
    return ScriptedLLM(choices=lambda messages, prefix: probs)


def test_logit_judge_returns_the_expected_score_and_the_most_likely_one() -> None:
    llm = _choices_llm({"4": 0.5, "5": 0.3, "3": 0.1})
    judge = CorrectnessJudge(_client(llm), score_from="logits", threshold=4.0)
    r = judge.evaluate(query="q", answer="a", reference="r")
    expected = (4 * 0.5 + 5 * 0.3 + 3 * 0.1) / 0.9
    assert r.score == pytest.approx(expected, abs=1e-4) and r.expected_score == r.score
    assert r.passing and "most likely 4" in r.feedback
    sent = llm.calls[0][0]
    assert sent[-1].content.rstrip().endswith('"reasoning": "<one or two sentences>"}.')  # the score-first JSON ask


def test_logit_judge_without_mass_on_the_scores_is_invalid_not_guessed() -> None:
    judge = CorrectnessJudge(_client(_choices_llm({"5": 0.2})), score_from="logits")
    r = judge.evaluate(query="q", answer="a", reference="r")
    assert r.invalid and r.score is None and "20%" in (r.invalid_reason or "")


def test_logit_scoring_needs_a_backend_that_reads_logits() -> None:
    with pytest.raises(ConfigError, match="score_from='logits'"):
        CorrectnessJudge(_client(ScriptedLLM()), score_from="logits")
    auto = CorrectnessJudge(_client(ScriptedLLM(default='{"score": 3, "reasoning": "x"}')), score_from="auto")
    assert not auto.uses_logits  # a remote-style backend keeps the generated JSON score
    assert auto.evaluate(query="q", answer="a", reference="r").score == 3.0
    with pytest.raises(ConfigError, match="score_from"):
        CorrectnessJudge(_client(ScriptedLLM()), score_from="vibes")  # type: ignore[arg-type]


def test_logit_judge_async_path_matches_the_sync_one() -> None:
    judge = CorrectnessJudge(_client(_choices_llm({"2": 1.0})), score_from="logits")
    r = asyncio.run(judge.aevaluate(query="q", answer="a", reference="r"))
    assert r.score == 2.0 and not r.passing


def test_choose_is_cached_and_counted(tmp_path: Path) -> None:
    from opro.llm import UsageLedger
    from opro.llm.cache import CallCache

    llm = _choices_llm({"5": 0.9})
    cache = CallCache(tmp_path / "calls.sqlite")
    usage = UsageLedger()
    client = ChatClient(llm, role="judge", cache=cache, usage=usage)
    first = client.choose("grade this", prefix="{", choices=("1", "5"))
    second = client.choose("grade this", prefix="{", choices=("1", "5"))
    assert first.text == "5" and not first.cached and second.cached
    assert len(llm.calls) == 1
    assert usage.snapshot()["judge"].calls == 1 and usage.snapshot()["judge"].cache_hits == 1
    other = client.choose("grade this", prefix="[", choices=("1", "5"))  # another prefix, another call
    assert not other.cached and len(llm.calls) == 2
    cache.close()


@pytest.mark.embedded
def test_embedded_logit_judge_scores_without_decoding_and_reruns_from_cache(
    embedded_strong_llm: LLM, tmp_path: Path
) -> None:
    """The real 1.5B judge read at the score position: a valid distribution, a right answer above a wrong one."""
    from opro.llm.cache import CallCache

    cache = CallCache(tmp_path / "calls.sqlite")
    client = ChatClient(embedded_strong_llm, role="judge", cache=cache)
    judge = CorrectnessJudge(client, score_from="logits")
    query = "Which activation function did AlexNet use?"
    reference = "AlexNet used the ReLU (rectified linear unit) activation."
    good = judge.evaluate(query=query, answer="It used ReLU activations.", reference=reference)
    bad = judge.evaluate(query=query, answer="It was trained on the MNIST digits dataset.", reference=reference)
    assert not good.invalid and not bad.invalid
    assert good.score is not None and bad.score is not None and 1.0 <= bad.score < good.score <= 5.0
    assert good.expected_score == good.score and "most likely" in good.feedback
    before = client.usage.snapshot()["judge"].calls
    again = judge.evaluate(query=query, answer="It used ReLU activations.", reference=reference)
    assert again.score == good.score and client.usage.snapshot()["judge"].calls == before  # warm: no call
    cache.close()


def test_the_judges_read_llamaindex_templates_without_importing_llama_index() -> None:
    # Importing llama_index.core costs about 3 s; a run with cached chunks must not pay it for prompt text.
    code = "import sys, opro.judges, opro.judges.yesno; print('llama_index.core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_template_text_from_an_unrecognised_source_is_none_so_the_caller_imports() -> None:
    from opro.judges.templates import _module_strings

    assert _module_strings("llama_index.core.evaluation.no_such_module", ("X",)) is None
    assert _module_strings("llama_index.core.evaluation.correctness", ("NO_SUCH_NAME",)) is None
    assert _module_strings("no_such_package.mod", ("X",)) is None


def test_score_sources_are_checked_by_one_validator_with_the_option_named() -> None:
    from opro.config import JudgeSection
    from opro.judges import SCORE_SOURCES, check_score_from

    assert SCORE_SOURCES == ("reply", "logits", "auto")
    assert [check_score_from(s, where="--score-from") for s in SCORE_SOURCES] == list(SCORE_SOURCES)
    with pytest.raises(ConfigError, match=r"^--score-from must be reply, logits or auto, got 'vibes'$"):
        check_score_from("vibes", where="--score-from")
    with pytest.raises(ConfigError, match=r"^\[judge\]\.score_from must be reply, logits or auto, got 'x'$"):
        JudgeSection(score_from="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^CorrectnessJudge score_from must be reply, logits or auto, got 'v'$"):
        CorrectnessJudge(_client(ScriptedLLM()), score_from="v")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be reply, logits or auto"):
        check_score_from("REPLY")  # exact names only, as before
