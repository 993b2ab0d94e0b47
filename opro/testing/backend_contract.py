"""The contract every LLM backend keeps (:class:`opro.llm.client.LLM`), one suite run against each of
them: a completion with its usage, a name and a concurrency bound, greedy replies that repeat, stop
strings and ``max_tokens`` obeyed, many requests answered in order and from several threads, the async
path, an :class:`~opro.errors.LLMError` that names the backend, choices scored or refused. Only what the
protocol promises is asserted.

A backend's tests run it by importing the tests and giving an ``llm`` fixture (the backend, answering
the questions below; a request of :data:`FAILING` must fail with an :class:`~opro.errors.LLMError`)::

    from opro.testing.backend_contract import *  # noqa: F403

    @pytest.fixture
    def llm():
        yield MyLLM(...)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from opro.errors import LLMError
from opro.llm import LLM, Completion, GenerationOptions, Message

#: Questions with different answers (mentioning the context: the loopback server's long task reply).
QUESTIONS = (
    "Using the context, name three colours.",
    "Using the context, count from one to five.",
    "Using the context, say hello in French.",
)
#: A question whose answer runs longer than SHORT tokens when LONG are allowed.
LONG_QUESTION = "Using the context, count from 1 to 20 in words, one number per line."
SHORT, LONG = 3, 48
#: A request every backend fails with an LLMError: the scripted model has no reply to it, the loopback
#: server answers it with an injected 500, and it overflows the embedded model's context window.
FAILING = (Message("user", "UNANSWERABLE " + "word " * 5000),)


def _ask(text: str) -> tuple[Message, ...]:
    return (Message("system", "You are a concise assistant."), Message("user", text))


def run_together(fn: Callable[[int], object], *, threads: int = 2, timeout_s: float = 60.0) -> list[BaseException]:
    """Run ``fn(i)`` in thread ``i`` of ``threads``, all released at one instant (a barrier): what
    workers starting together do. The exceptions they raised (none: an empty list)."""
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait(timeout=timeout_s)
            fn(index)
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    started = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join(timeout=timeout_s)
    return errors


def _greedy(max_tokens: int = LONG, **kwargs: object) -> GenerationOptions:
    return GenerationOptions(temperature=0.0, max_tokens=max_tokens, seed=7, **kwargs)  # type: ignore[arg-type]


def test_a_completion_has_text_and_usage(llm: LLM) -> None:
    c = llm.generate(_ask(QUESTIONS[0]), _greedy())
    assert isinstance(c, Completion) and c.text.strip(), c
    assert isinstance(c.model, str) and c.model
    assert c.prompt_tokens > 0 and c.completion_tokens > 0, c
    assert c.latency_s >= 0 and not c.cached


def test_the_backend_names_itself_and_bounds_its_concurrency(llm: LLM) -> None:
    assert isinstance(llm.model, str) and llm.model
    assert isinstance(llm.identity, str) and llm.identity  # part of the call cache's key
    assert {"provider": llm.describe()["provider"], "model": llm.describe()["model"]} == {
        "provider": llm.provider, "model": llm.model}
    assert isinstance(llm.max_concurrency, int) and llm.max_concurrency >= 1
    taken = 0
    while taken <= llm.max_concurrency and llm.slots.acquire(blocking=False):
        taken += 1
    for _ in range(taken):
        llm.slots.release()
    assert taken == llm.max_concurrency  # exactly that many calls at once, whoever the callers are


def test_a_seeded_greedy_request_gives_the_same_reply_again(llm: LLM) -> None:
    first = llm.generate(_ask(QUESTIONS[1]), _greedy())
    llm.generate(_ask(QUESTIONS[2]), _greedy())  # another call in between
    again = llm.generate(_ask(QUESTIONS[1]), _greedy())
    assert (again.text, again.completion_tokens) == (first.text, first.completion_tokens)


def test_max_tokens_bounds_the_completion(llm: LLM) -> None:
    full = llm.generate(_ask(LONG_QUESTION), _greedy(LONG))
    short = llm.generate(_ask(LONG_QUESTION), _greedy(SHORT))
    assert full.completion_tokens > SHORT, full  # the limit has something to cut
    assert 0 < short.completion_tokens <= SHORT, short
    assert len(short.text) < len(full.text)


def test_a_stop_string_ends_the_completion_before_it(llm: LLM) -> None:
    full = llm.generate(_ask(LONG_QUESTION), _greedy())
    middle = len(full.text) // 2
    stop = full.text[middle : middle + 3]
    assert len(stop) == 3, full
    stopped = llm.generate(_ask(LONG_QUESTION), _greedy(stop=(stop,)))
    assert stop not in stopped.text
    assert full.text.startswith(stopped.text) and len(stopped.text) < len(full.text), (stop, stopped.text, full.text)


def test_a_sampling_temperature_and_seed_are_accepted(llm: LLM) -> None:
    for seed in (1, 2):
        c = llm.generate(_ask(QUESTIONS[0]), GenerationOptions(temperature=1.0, max_tokens=SHORT, seed=seed))
        assert isinstance(c.text, str) and c.completion_tokens <= SHORT, c


def test_generate_many_answers_in_request_order_as_one_at_a_time(llm: LLM) -> None:
    calls = [(_ask(q), _greedy(12)) for q in QUESTIONS]
    one_by_one = [llm.generate(m, o) for m, o in calls]
    assert len({c.text for c in one_by_one}) == len(QUESTIONS)  # distinct replies: order is checkable
    calls.insert(1, (FAILING, _greedy(12)))
    results = llm.generate_many(calls)
    assert len(results) == len(calls)
    assert isinstance(results[1], LLMError)  # a failed call is its error, in its place
    answered = [r for i, r in enumerate(results) if i != 1]
    assert all(isinstance(r, Completion) for r in answered), results
    assert [(r.text, r.completion_tokens) for r in answered] == [  # type: ignore[union-attr]
        (c.text, c.completion_tokens) for c in one_by_one]


def test_calls_from_several_threads_get_their_own_replies(llm: LLM) -> None:
    calls = [(_ask(q), _greedy(12)) for q in QUESTIONS]
    alone = [llm.generate(m, o).text for m, o in calls]
    together: dict[int, str] = {}

    def call(i: int) -> None:
        together[i] = llm.generate(*calls[i]).text

    assert run_together(call, threads=len(calls), timeout_s=300) == []
    assert [together.get(i) for i in range(len(calls))] == alone


def test_the_async_path_gives_the_sync_reply(llm: LLM) -> None:
    sync = llm.generate(_ask(QUESTIONS[2]), _greedy(12))
    got = asyncio.run(llm.agenerate(_ask(QUESTIONS[2]), _greedy(12)))
    assert (got.text, got.completion_tokens) == (sync.text, sync.completion_tokens)


def test_a_failed_call_is_an_llm_error_naming_the_backend(llm: LLM) -> None:
    with pytest.raises(LLMError) as caught:
        llm.generate(FAILING, _greedy(4))
    assert caught.value.provider == llm.provider
    with pytest.raises(LLMError):
        asyncio.run(llm.agenerate(FAILING, _greedy(4)))


def test_choices_are_scored_or_refused_as_the_backend_says(llm: LLM) -> None:
    choices = ("1", "2", "3")  # single tokens, as logit scoring needs
    ask = _ask("How many capitals does France have? Reply with one digit.")
    if not llm.supports_choice_logprobs:
        with pytest.raises(LLMError):
            llm.choice_logprobs(ask, prefix="", choices=choices)
        return
    c = llm.choice_logprobs(ask, prefix="", choices=choices)
    assert c.top_logprobs is not None and len(c.top_logprobs) == 1
    step = c.top_logprobs[0]
    assert set(step) == set(choices) and all(v <= 0.0 for v in step.values())
    assert c.text == max(step, key=lambda k: step[k])


__all__ = [
    "FAILING",
    "LONG",
    "LONG_QUESTION",
    "QUESTIONS",
    "SHORT",
    "run_together",
    "test_a_completion_has_text_and_usage",
    "test_a_failed_call_is_an_llm_error_naming_the_backend",
    "test_a_sampling_temperature_and_seed_are_accepted",
    "test_a_seeded_greedy_request_gives_the_same_reply_again",
    "test_a_stop_string_ends_the_completion_before_it",
    "test_calls_from_several_threads_get_their_own_replies",
    "test_choices_are_scored_or_refused_as_the_backend_says",
    "test_generate_many_answers_in_request_order_as_one_at_a_time",
    "test_max_tokens_bounds_the_completion",
    "test_the_async_path_gives_the_sync_reply",
    "test_the_backend_names_itself_and_bounds_its_concurrency",
]
