"""The llamacpp backend on the real embedded 0.5B model (a handful of short calls)."""

from __future__ import annotations

import json

import pytest
from fakes import run_together

from opro.errors import LLMBadRequestError
from opro.llm import LLM, ChatClient, GenerationOptions, Message

pytestmark = pytest.mark.embedded

CAPITAL = (
    Message("system", "You are a concise assistant."),
    Message("user", "What is the capital of France? Answer in one word."),
)


def test_plain_completion(embedded_task_llm: LLM) -> None:
    c = embedded_task_llm.generate(CAPITAL, GenerationOptions(temperature=0.0, max_tokens=8, seed=0))
    assert "paris" in c.text.lower()
    assert c.prompt_tokens > 10 and 0 < c.completion_tokens <= 8
    assert c.model == "qwen2.5-coder-0.5b-instruct" and c.latency_s > 0
    assert embedded_task_llm.identity == "llamacpp:1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_json_schema_output_parses(embedded_task_llm: LLM) -> None:
    # Bounded by the schema (enum, maxLength) so the reply always fits in max_tokens.
    schema = {
        "type": "object",
        "properties": {
            "score": {"enum": [1, 2, 3, 4, 5]},
            "reason": {"type": "string", "maxLength": 40},
        },
        "required": ["score", "reason"],
    }
    client = ChatClient(embedded_task_llm, role="judge")
    c = client.complete(
        "Rate from 1 to 5 how well 'Paris' answers 'What is the capital of France?'. Reply as JSON.",
        json_schema=schema,
        max_tokens=40,
    )
    data = json.loads(c.text)
    assert data["score"] in (1, 2, 3, 4, 5)
    assert isinstance(data["reason"], str) and len(data["reason"]) <= 40
    assert set(data) == {"score", "reason"}


def test_seed_is_honoured_and_reproducible(embedded_task_llm: LLM) -> None:
    llm = embedded_task_llm
    msgs = (Message("user", "Write one short sentence about a cat."),)

    def sample(seed: int) -> str:
        return llm.generate(msgs, GenerationOptions(temperature=1.0, max_tokens=8, seed=seed)).text

    # Cold evaluation every call: bit-for-bit reproducible.
    llm.kv_reuse = False  # type: ignore[attr-defined]
    try:
        first = sample(1234)
        others = {sample(99), sample(7)}
        assert sample(1234) == first  # after other calls in between
    finally:
        llm.kv_reuse = True  # type: ignore[attr-defined]
    assert len(others | {first}) > 1  # the seed matters
    # With prefix reuse the same KV state gives the same sample too.
    sample(1234)
    assert sample(1234) == sample(1234)


def test_top_logprobs_with_logprobs_enabled(embedded_task_llm: LLM) -> None:
    from opro.llm.llamacpp import LlamaCppLLM

    llm = LlamaCppLLM(model_path="qwen2.5-coder-0.5b-instruct", n_ctx=512, logprobs=True)
    try:
        assert llm.supports_logprobs and not embedded_task_llm.supports_logprobs
        c = ChatClient(llm).complete("Reply with one digit from 1 to 5: how good is Paris as the capital of France?",
                                     max_tokens=1, top_logprobs=5)
        assert c.top_logprobs is not None and len(c.top_logprobs) == 1
        top = c.top_logprobs[0]
        assert len(top) == 5 and all(v <= 0.0 for v in top.values())
        assert max(top, key=lambda t: top[t]) == c.text
    finally:
        llm.close()


def test_concurrent_callers_are_serialized(embedded_task_llm: LLM) -> None:
    assert embedded_task_llm.max_concurrency == 1
    results: dict[int, str] = {}
    opts = GenerationOptions(temperature=0.0, max_tokens=6, seed=0)

    def call(i: int) -> None:
        results[i] = embedded_task_llm.generate((Message("user", f"Say the number {i + 2} only."),), opts).text

    assert run_together(call, threads=2, timeout_s=300) == []
    assert "2" in results[0] and "3" in results[1]


def test_context_overflow_is_a_clear_error(embedded_task_llm: LLM) -> None:
    long = "word " * 5000
    with pytest.raises(LLMBadRequestError, match=r"prompt has \d+ tokens but the context window \(n_ctx\) is 4096"):
        embedded_task_llm.generate((Message("user", long),), GenerationOptions(max_tokens=4))


def test_batched_decoding_gives_the_one_at_a_time_answers(embedded_task_llm: LLM) -> None:
    # One question under three instructions (a shared context prefix, different tails), plus a stop
    # string and an overflowing call: a batch gives each call what a call on its own gives.
    llm = embedded_task_llm
    assert llm.supports_batch and llm.batch_width >= 3  # type: ignore[attr-defined]
    context = "AlexNet won the ImageNet challenge in 2012. It was trained on two GTX 580 GPUs by Alex Krizhevsky. "
    calls = [
        ((Message("user", f"{context}\nQuery: Who trained AlexNet?\n{ins}\nAnswer: "),), GenerationOptions(max_tokens=12))
        for ins in ("Answer briefly.", "Answer in one full sentence.", "List the facts you used.")
    ]
    calls.append(((Message("user", f"{context}\nQuery: When?\nAnswer: "),), GenerationOptions(max_tokens=12, stop=("20",))))
    calls.append(((Message("user", "word " * 5000),), GenerationOptions(max_tokens=4)))
    one_by_one = []
    for messages, options in calls[:-1]:
        c = llm.generate(messages, options)
        one_by_one.append((c.text, c.completion_tokens, c.finish_reason))
    batched = llm.generate_many(calls)
    assert isinstance(batched[-1], LLMBadRequestError)
    assert [(c.text, c.completion_tokens, c.finish_reason) for c in batched[:-1]] == one_by_one  # type: ignore[union-attr]
    assert {r for _, _, r in one_by_one} == {"stop", "length"}  # both ways of ending were compared
    # The model is left as a one-at-a-time call expects it.
    again = llm.generate(*calls[1])
    assert (again.text, again.completion_tokens) == one_by_one[1][:2]


def test_saved_prefixes_start_a_returning_prompt_where_it_left_off(embedded_task_llm: LLM) -> None:
    # Question A's candidates and two judge-like calls, then question B's, then A's again (the next
    # step): A's group and judge call start from A's saved states instead of prefilling A's facts
    # again, and give what a context without saved states gives.
    llm = embedded_task_llm
    facts = {
        "A": "AlexNet won the ImageNet challenge in 2012 with a top-5 error of 15.3 percent. It was trained on two "
             "GTX 580 GPUs for five to six days by Alex Krizhevsky, Ilya Sutskever and Geoffrey Hinton. ",
        "B": "The Transformer was introduced in 2017 in the paper Attention Is All You Need by eight researchers at "
             "Google. It replaced recurrence with self-attention and was first applied to machine translation. ",
    }

    def group(key: str) -> list[tuple[tuple[Message, ...], GenerationOptions]]:
        return [((Message("user", f"{facts[key] * 2}\nQuery: Who made it?\n{ins}\nAnswer: "),), GenerationOptions(max_tokens=10))
                for ins in ("Answer briefly.", "Answer in one sentence.")]

    def judged(key: str, answer: str = "Hinton") -> dict[str, float]:
        c = llm.choice_logprobs(
            (Message("user", f"Rate the answer against these facts:\n{facts[key] * 2}\nThe answer: {answer}. Score 1 to 5."),),
            prefix="Score: ", choices=("1", "2", "3", "4", "5"),
        )
        assert c.top_logprobs is not None
        return c.top_logprobs[0]

    saved = llm._saved  # type: ignore[attr-defined]
    first = [c.text for c in llm.generate_many(group("A"))]  # type: ignore[union-attr]
    judged("A", "Krizhevsky")
    first_judged = judged("A")  # shares the facts with the call before: they are saved
    llm.generate_many(group("B"))
    judged("B", "Krizhevsky")
    judged("B")
    hits, restored = saved.hits, saved.restored_tokens
    again = [c.text for c in llm.generate_many(group("A"))]  # type: ignore[union-attr]
    again_judged = judged("A")
    assert saved.hits == hits + 2 and saved.restored_tokens - restored > 2 * 60, (saved.hits, saved.restored_tokens)
    assert again == first
    assert max(again_judged, key=again_judged.__getitem__) == max(first_judged, key=first_judged.__getitem__)
    assert again_judged == pytest.approx(first_judged, abs=0.1)  # prefilled in other batch sizes: close, not equal
    # Without saved states the same calls give the same answers.
    capacity, saved.capacity = saved.capacity, 0
    try:
        llm.generate_many(group("B"))
        assert [c.text for c in llm.generate_many(group("A"))] == first  # type: ignore[union-attr]
        assert saved.hits == hits + 2
    finally:
        saved.capacity = capacity


def test_a_call_alone_keeps_its_prompt_for_the_next_steps_candidates(embedded_task_llm: LLM) -> None:
    # Step 0 asks one candidate per question (one call alone), the next step several: their batch
    # starts from the state the lone call left, and answers as it would without saved states.
    llm = embedded_task_llm
    facts = ("ResNet was introduced in 2015 by Kaiming He and colleagues at Microsoft Research. Its residual "
             "connections let networks of 152 layers train, and it won the ImageNet challenge that year. ") * 2
    other = ("BERT was released by Google in 2018. It is pretrained with masked language modelling and next sentence "
             "prediction on books and Wikipedia, then fine-tuned for each task. ") * 2

    def calls(text: str) -> list[tuple[tuple[Message, ...], GenerationOptions]]:
        return [((Message("user", f"{text}\nQuery: Who made it?\n{ins}\nAnswer: "),), GenerationOptions(max_tokens=10))
                for ins in ("Answer briefly.", "Answer in one sentence.")]

    saved = llm._saved  # type: ignore[attr-defined]
    alone = llm.generate(*calls(facts)[0])
    llm.generate_many(calls(other))
    hits, restored = saved.hits, saved.restored_tokens
    batch = [c.text for c in llm.generate_many(calls(facts))]  # type: ignore[union-attr]
    assert saved.hits == hits + 1 and saved.restored_tokens - restored > 60, (saved.hits, saved.restored_tokens)
    llm.generate_many(calls(other))
    hits = saved.hits
    restored_alone = llm.generate(*calls(facts)[1]).text  # a call alone starts from a saved state too
    assert saved.hits == hits + 1
    capacity, saved.capacity = saved.capacity, 0
    try:
        llm.generate_many(calls(other))
        assert [c.text for c in llm.generate_many(calls(facts))] == batch  # type: ignore[union-attr]
        llm.generate_many(calls(other))
        assert llm.generate(*calls(facts)[0]).text == alone.text
        llm.generate_many(calls(other))
        assert llm.generate(*calls(facts)[1]).text == restored_alone
    finally:
        saved.capacity = capacity


def test_drafted_tokens_are_kept_only_where_greedy_decoding_agrees(embedded_task_llm: LLM) -> None:
    # Three answers that quote their context: steps of 3 live answers get a drafted token (a 4th
    # column), and many drafts are right. The answers are those decoded without drafts: a draft
    # accepted where greedy decoding would have chosen another token would show here.
    llm = embedded_task_llm
    sentence = "The network had eight layers: five convolutional layers followed by three fully connected layers."
    calls = [
        ((Message("user", f"Text: {sentence}\n{ins}"),), GenerationOptions(max_tokens=24))
        for ins in ("Repeat the text exactly.", "Copy the text word for word.", "Quote the text.")
    ]
    fill = llm.draft_fill  # type: ignore[attr-defined]
    try:
        llm.draft_fill = 0  # type: ignore[attr-defined]
        drafted, kept = llm.drafted, llm.draft_hits  # type: ignore[attr-defined]
        plain = [(c.text, c.completion_tokens) for c in llm.generate_many(calls)]  # type: ignore[union-attr]
        assert (llm.drafted, llm.draft_hits) == (drafted, kept)  # type: ignore[attr-defined]  # off: none
        llm.draft_fill = 4  # type: ignore[attr-defined]
        with_drafts = [(c.text, c.completion_tokens) for c in llm.generate_many(calls)]  # type: ignore[union-attr]
    finally:
        llm.draft_fill = fill  # type: ignore[attr-defined]
    assert with_drafts == plain
    assert any("convolutional" in text for text, _ in plain)  # the answers do quote the text
    drafted, kept = llm.drafted - drafted, llm.draft_hits - kept  # type: ignore[attr-defined]
    assert kept >= 5 and drafted > 0, (drafted, kept)


def test_drafts_fill_a_step_to_a_multiple_of_draft_fill_from_the_latest_match(embedded_task_llm: LLM) -> None:
    from opro.llm.llamacpp_batch import Seq, draft_tokens, lookup

    # The last 3 tokens (7, 8, 9) occurred twice: the latest occurrence's continuation is drafted.
    assert lookup([7, 8, 9, 1, 2, 7, 8, 9, 3, 4, 5, 7, 8, 9], 2) == [3, 4]
    assert lookup([1, 2, 3, 9, 2, 3], 3) == [9, 2, 3]  # no 3-gram match: the 2-gram (2, 3)
    assert lookup([5, 6, 5], 4) == [6, 5]  # then one token; at most what follows the match
    assert lookup([1, 2, 3], 2) == []

    def seq(*tokens: int) -> Seq:
        return Seq(index=0, prompt=[1, 2, 3, 4, 5, 6], max_tokens=10, stops=[], tokens=list(tokens))

    assert embedded_task_llm.draft_fill == 4  # type: ignore[attr-defined]  # the default
    fill, n_batch = embedded_task_llm.draft_fill, embedded_task_llm.n_batch  # type: ignore[attr-defined]

    def drafts(live: list[Seq]) -> list[list[int]]:
        return draft_tokens(live, fill=fill, n_batch=n_batch)

    assert drafts([seq(3), seq(4), seq(9)]) == [[4], [], []]  # 3 live: 1 draft fills the step to 4
    assert drafts([seq(3), seq(4)]) == [[4], [5]]  # 2 live: 2 drafts, shared out in turn
    assert drafts([seq(9), seq(5)]) == [[], [6, 5]]  # one with no match: the other takes both
    assert drafts([seq(3)]) == [[]]  # one live answer: one token is the cheapest step
    assert drafts([seq(3), seq(3), seq(3), seq(3)]) == [[], [], [], []]  # already a multiple of 4
