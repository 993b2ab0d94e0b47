"""ChatClient: cache keys, cache hits, usage accounting, async and batched calls."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from opro.llm import (
    ChatClient,
    Completion,
    GenerationOptions,
    Message,
    Price,
    Request,
    UsageLedger,
    as_messages,
    cache_key,
)
from opro.llm.cache import CallCache
from opro.llm.client import CallLog
from opro.llm.scripted import ScriptedLLM


def echo(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return f"{messages[-1].content}|t={options.temperature}|s={options.seed}"


@pytest.fixture
def cache(tmp_path: Path) -> CallCache:
    return CallCache(tmp_path / "calls.sqlite")


def test_as_messages_accepts_strings_dicts_and_messages() -> None:
    assert as_messages("hi") == (Message("user", "hi"),)
    assert as_messages([{"role": "system", "content": "s"}, Message("user", "u")]) == (
        Message("system", "s"),
        Message("user", "u"),
    )


def test_cache_key_stability() -> None:
    msgs = (Message("user", "q"),)
    base = GenerationOptions(temperature=0.0, max_tokens=10, seed=1)
    assert cache_key("id", msgs, base, 0) == cache_key("id", msgs, GenerationOptions(0.0, 10, 1), 0)
    # Deterministic decoding: the sample index does not matter.
    assert cache_key("id", msgs, base, 0) == cache_key("id", msgs, base, 3)
    hot = GenerationOptions(temperature=0.7, max_tokens=10, seed=1)
    assert cache_key("id", msgs, hot, 0) != cache_key("id", msgs, hot, 1)
    assert cache_key("id", msgs, base, 0) != cache_key("id", msgs, hot, 0)
    assert cache_key("id", msgs, base, 0) != cache_key("other", msgs, base, 0)
    assert cache_key("id", msgs, base, 0) != cache_key("id", (Message("user", "q2"),), base, 0)
    assert cache_key("id", msgs, base, 0) != cache_key("id", msgs, GenerationOptions(0.0, 11, 1), 0)


def test_cache_miss_then_hit(cache: CallCache) -> None:
    llm = ScriptedLLM(default=echo)
    client = ChatClient(llm, role="task", cache=cache)
    first = client.complete("hello", max_tokens=5)
    second = client.complete("hello", max_tokens=5)
    assert not first.cached and second.cached
    assert second.text == first.text
    assert len(llm.calls) == 1
    client.complete("hello", max_tokens=6)  # different option: a miss
    assert len(llm.calls) == 2


def test_sampling_index_gives_distinct_reproducible_samples(cache: CallCache) -> None:
    llm = ScriptedLLM(default=echo)
    client = ChatClient(llm, role="optimizer", cache=cache, seed=100)
    samples = [client.complete("propose", temperature=1.0, sample_index=i).text for i in range(3)]
    assert len(set(samples)) == 3  # seed + sample_index differ
    again = [client.complete("propose", temperature=1.0, sample_index=i) for i in range(3)]
    assert [c.text for c in again] == samples and all(c.cached for c in again)
    assert len(llm.calls) == 3
    # At temperature 0 the sample index changes nothing: one call, then hits.
    greedy = [client.complete("greedy", temperature=0.0, sample_index=i) for i in range(3)]
    assert greedy[0].text.endswith("s=100") and [c.cached for c in greedy] == [False, True, True]
    assert len(llm.calls) == 4


def test_warm_cache_rerun_makes_zero_backend_calls(tmp_path: Path) -> None:
    def run(llm: ScriptedLLM) -> list[str]:
        cache = CallCache(tmp_path / "warm.sqlite")
        client = ChatClient(llm, role="judge", cache=cache)
        out = [c.text for c in client.map([Request(f"q{i}", temperature=0.0) for i in range(5)])]
        out.append(client.complete("q-sampled", temperature=0.9, sample_index=2).text)
        cache.close()
        return out

    cold_llm = ScriptedLLM(default=echo)
    cold = run(cold_llm)
    assert len(cold_llm.calls) == 6
    warm_llm = ScriptedLLM(default=echo)
    assert run(warm_llm) == cold
    assert warm_llm.calls == []


def test_cache_off_always_calls(tmp_path: Path) -> None:
    llm = ScriptedLLM(default="x")
    client = ChatClient(llm, cache=None)
    client.complete("a")
    client.complete("a")
    assert len(llm.calls) == 2


def test_usage_ledger_per_role(cache: CallCache) -> None:
    usage = UsageLedger(prices={"priced": Price(prompt=1.0, completion=2.0)})
    task = ChatClient(ScriptedLLM(default="one two three"), role="task", cache=cache, usage=usage)
    judge = ChatClient(ScriptedLLM(default="four", model="priced"), role="judge", cache=cache, usage=usage)
    task.complete("a b")
    task.complete("a b")  # cached
    judge.complete("c d e")
    snap = usage.snapshot()
    assert (snap["task"].calls, snap["task"].cache_hits) == (1, 1)
    assert (snap["task"].prompt_tokens, snap["task"].completion_tokens) == (2, 3)
    assert snap["task"].cost_usd is None  # no price for "scripted"
    assert snap["judge"].calls == 1 and snap["judge"].cost_usd == pytest.approx((3 * 1.0 + 1 * 2.0) / 1e6)
    assert usage.total_calls() == 2 and usage.total_tokens() == 2 + 3 + 3 + 1
    assert json.dumps(usage.as_dict())


def test_a_call_log_hears_the_key_of_every_call_made_or_answered_from_the_cache(cache: CallCache) -> None:
    """What `opro optimize` counts the calls a probe saved it by: the keys, by role, not an estimate."""
    usage = UsageLedger()
    task = ChatClient(ScriptedLLM(default="x"), role="task", cache=cache, usage=usage)
    judge = ChatClient(ScriptedLLM(default="y"), role="judge", cache=cache, usage=usage)
    task.complete("before")
    with usage.listen(CallLog()) as log:
        task.complete("a")
        task.complete("a")  # from the cache
        task.complete("before")  # asked before the log listened: from the cache
        judge.complete_many([("b", {}), ("b", {}), ("c", {})])  # the copy of "b" is answered from the first
    task.complete("after")
    key = {text: cache_key(task.llm.identity, as_messages(text), GenerationOptions(seed=0), 0)
           for text in ("a", "b", "c", "before", "after")}
    assert log.made == {"task": {key["a"]}, "judge": {key["b"], key["c"]}}
    assert log.cached == {"task": {key["a"], key["before"]}, "judge": {key["b"]}}
    assert log.asked("task") == {key["a"], key["before"]} and log.asked("optimizer") == set()


def test_json_schema_and_logprobs_only_sent_when_supported() -> None:
    llm = ScriptedLLM(default="{}")
    client = ChatClient(llm)
    client.complete("x", json_schema={"type": "object"}, top_logprobs=5)
    _, opts = llm.calls[0]
    assert opts.schema() == {"type": "object"}  # scripted supports schemas
    assert opts.top_logprobs is None  # ... but not logprobs


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="temprature"):
        ChatClient(ScriptedLLM(default="x")).complete("x", temprature=0.5)


def test_async_path_uses_cache(cache: CallCache) -> None:
    llm = ScriptedLLM(default=echo)
    client = ChatClient(llm, cache=cache)

    async def main() -> list[Completion]:
        return list(await asyncio.gather(*(client.acomplete(f"q{i}") for i in range(4))))

    first = asyncio.run(main())
    second = asyncio.run(main())
    assert [c.text for c in first] == [c.text for c in second]
    assert all(c.cached for c in second) and len(llm.calls) == 4


def test_map_preserves_order_under_concurrency() -> None:
    def slow(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        n = int(messages[-1].content)
        time.sleep(0.002 * (10 - n))  # later requests finish first
        return str(n * n)

    llm = ScriptedLLM(default=slow)
    client = ChatClient(llm)
    out = client.map([Request(str(i)) for i in range(10)], workers=4)
    assert [c.text for c in out] == [str(i * i) for i in range(10)]
    assert client.map([]) == []


def test_completion_json_roundtrip() -> None:
    c = Completion("t", "m", 1, 2, 0.5, False, ({"a": -0.1},), "stop")
    assert Completion.from_json(c.to_json()) == c


def test_scripted_rules_order_and_recording(tmp_path: Path) -> None:
    llm = ScriptedLLM(rules=[(r"score", "5")], replies=["first", "second"])
    assert llm.generate(as_messages("give a score"), GenerationOptions()).text == "5"
    assert llm.generate(as_messages("other"), GenerationOptions()).text == "first"
    assert llm.generate(as_messages("other"), GenerationOptions()).text == "second"
    from opro.errors import LLMBadRequestError

    with pytest.raises(LLMBadRequestError):
        llm.generate(as_messages("other"), GenerationOptions())
    key = cache_key("scripted:scripted", as_messages("rec"), GenerationOptions(), 0)
    ScriptedLLM.record(tmp_path / "rec.jsonl", {key: "recorded"})
    replay = ScriptedLLM(recording=tmp_path / "rec.jsonl")
    assert replay.generate(as_messages("rec"), GenerationOptions()).text == "recorded"


def test_usage_ledger_is_thread_safe() -> None:
    usage = UsageLedger()
    done = Completion("x", "m", prompt_tokens=1, completion_tokens=1)

    def work() -> None:
        for _ in range(500):
            usage.record("task", done)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert usage.snapshot()["task"].calls == 2000


def test_the_same_call_from_two_threads_at_once_is_sent_once(cache: CallCache) -> None:
    """Two threads asking the same call while it is in flight: one request, the other reads the cache."""
    slow = threading.Event()

    def reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        slow.wait(5)  # keep the first call in flight until the second has asked
        return "four"

    llm = ScriptedLLM(default=reply)
    llm.max_concurrency = 8
    client = ChatClient(llm, role="task", cache=cache)
    other = ChatClient(llm, role="task", cache=None)  # no cache: nothing to wait for, always sent
    got: list[Completion] = []
    threads = [threading.Thread(target=lambda: got.append(client.complete("2 + 2?", max_tokens=4))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    slow.set()
    for t in threads:
        t.join(10)
    assert [c.text for c in got] == ["four"] * 3
    assert len(llm.calls) == 1 and sorted(c.cached for c in got) == [False, True, True]
    other.complete("2 + 2?", max_tokens=4)
    other.complete("2 + 2?", max_tokens=4)
    assert len(llm.calls) == 3
