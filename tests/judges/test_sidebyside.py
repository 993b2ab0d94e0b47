"""The side-by-side judge: both answers of a question in one call, in a seeded order."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from opro.config import JudgeSection, config_from_dict
from opro.errors import ConfigError
from opro.judges import SideBySideJudge, build_paired_judge
from opro.judges.parsing import parse_pair_scores
from opro.judges.sidebyside import first_shown
from opro.llm import ChatClient, GenerationOptions, Message
from opro.llm.cache import CallCache
from opro.llm.scripted import ScriptedLLM


def _shown(messages: tuple[Message, ...]) -> tuple[str, str]:
    user = messages[-1].content
    a = re.search(r"^Answer A: (.*)$", user, re.M)
    b = re.search(r"^Answer B: (.*)$", user, re.M)
    assert a and b
    return a.group(1), b.group(1)


def _facts(answer: str) -> int:
    return 5 if "1889" in answer else 2


def fair_judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """Scores by content: an answer naming 1889 is right (5), any other is wrong (2)."""
    a, b = _shown(messages)
    return json.dumps({"score_a": _facts(a), "score_b": _facts(b)})


def first_position_judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """A judge that favours whatever it reads first, by a point."""
    a, b = _shown(messages)
    return json.dumps({"score_a": min(_facts(a) + 1, 5), "score_b": _facts(b)})


RIGHT = "It was completed in 1889."
WRONG = "It was completed in 1925."


def _judge(responder, *, cache: CallCache | None = None, **kwargs) -> tuple[SideBySideJudge, ScriptedLLM]:
    llm = ScriptedLLM(default=responder)
    return SideBySideJudge(ChatClient(llm, role="judge", cache=cache), **kwargs), llm


def _queries_in_both_orders(seed: int) -> tuple[str, str]:
    queries = [f"When was tower {i} completed?" for i in range(64)]
    first = next(q for q in queries if first_shown(seed=seed, query=q))
    second = next(q for q in queries if not first_shown(seed=seed, query=q))
    return first, second


def test_one_call_carries_both_answers_in_the_seeded_order_and_scores_map_back() -> None:
    as_a, as_b = _queries_in_both_orders(seed=3)
    for query, right_shown_first in ((as_a, True), (as_b, False)):
        judge, llm = _judge(fair_judge, seed=3)
        verdict = judge.judge(query=query, reference="Completed in 1889.", first=RIGHT, second=WRONG)
        assert len(llm.calls) == 1 and verdict.calls == 1
        messages = llm.calls[0][0]
        assert _shown(messages) == ((RIGHT, WRONG) if right_shown_first else (WRONG, RIGHT))
        assert query in messages[-1].content and "Completed in 1889." in messages[-1].content
        assert verdict.first_as_a is right_shown_first
        # whichever order it was shown in, the first configuration's answer gets its own score
        assert verdict.scores == (5.0, 2.0) and verdict.difference == 3.0
        assert json.loads(llm.calls[0][1].json_schema or "{}")["required"] == ["score_a", "score_b"]


def test_the_order_is_a_pure_function_of_seed_and_question() -> None:
    queries = [f"q{i}" for i in range(200)]
    orders = [first_shown(seed=0, query=q) for q in queries]
    assert orders == [first_shown(seed=0, query=q) for q in queries]
    assert 60 < sum(orders) < 140  # both orders occur, about half each
    assert orders != [first_shown(seed=1, query=q) for q in queries]


def test_both_orders_average_out_a_position_bias_and_report_agreement() -> None:
    query = _queries_in_both_orders(seed=0)[0]
    judge, llm = _judge(first_position_judge, seed=0, both_orders=True)
    verdict = judge.judge(query=query, reference="1889", first=RIGHT, second=WRONG)
    assert len(llm.calls) == 2
    assert [_shown(m) for m, _ in llm.calls] == [(RIGHT, WRONG), (WRONG, RIGHT)]
    assert verdict.readings == ((5.0, 2.0), (5.0, 3.0))  # each reading in the caller's order
    assert verdict.scores == (5.0, 2.5) and verdict.order_agrees is True
    # two equally good answers: the first position wins in each order, so the orders disagree
    tie, _ = _judge(first_position_judge, seed=0, both_orders=True)
    v = tie.judge(query=query, reference="1889", first=WRONG, second="Finished in 1925.")
    assert v.readings == ((3.0, 2.0), (2.0, 3.0)) and v.order_agrees is False and v.difference == 0.0


def test_identical_answers_after_normalization_make_no_call_and_differ_by_exactly_zero() -> None:
    judge, llm = _judge(fair_judge, both_orders=True)
    verdict = judge.judge(query="q", reference="r", first="  It was 1889.\n", second="it  was 1889.", tie=4.2)
    assert llm.calls == [] and verdict.identical and verdict.calls == 0
    assert verdict.scores == (4.2, 4.2) and verdict.difference == 0.0


def test_a_warm_rerun_makes_no_judge_call(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "calls.sqlite")
    judge, llm = _judge(fair_judge, cache=cache, both_orders=True)
    cold = judge.judge(query="q", reference="1889", first=RIGHT, second=WRONG)
    assert len(llm.calls) == 2 and cold.calls == 2
    again, llm2 = _judge(fair_judge, cache=cache, both_orders=True)
    warm = again.judge(query="q", reference="1889", first=RIGHT, second=WRONG)
    assert llm2.calls == [] and warm.calls == 0 and warm.scores == cold.scores
    cache.close()


def test_an_unreadable_reply_is_invalid_and_asked_again_on_rerun(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "calls.sqlite")
    replies = iter(['{"score_a": 4}', '{"score_a": 4, "score_b": 2}'])
    judge, _ = _judge(lambda m, o: next(replies), cache=cache)
    bad = judge.judge(query="q", reference="r", first=RIGHT, second=WRONG)
    assert bad.invalid and bad.difference is None and "no score for answer B" in (bad.invalid_reason or "")
    assert len(cache) == 0  # not kept: the next run asks again
    good = judge.judge(query="q", reference="r", first=RIGHT, second=WRONG)
    assert good.scores is not None and sorted(good.scores) == [2.0, 4.0] and len(cache) == 1
    cache.close()


@pytest.mark.parametrize(("reply", "scores"), [
    ('{"score_a": 4, "score_b": 2}', (4.0, 2.0)),
    ("A: 3\nB: 5/5", (3.0, 5.0)),
    ("Answer A: 1\nAnswer B: 4", (1.0, 4.0)),
    ('{"score_a": 9, "score_b": 2}', None),
    ('{"score_a": 4, "score_b": 2}\nA: 3', None),
    ("Both are fine.", None),
    ("", None),
])
def test_pair_parser(reply: str, scores: tuple[float, float] | None) -> None:
    assert parse_pair_scores(reply).scores == scores


def test_logit_scores_are_the_expected_scores_at_each_position() -> None:
    def choices(messages: tuple[Message, ...], prefix: str) -> dict[str, float]:
        a, b = _shown(messages)
        shown = b if '"score_b"' in prefix else a
        return {"5": 0.8, "4": 0.2} if "1889" in shown else {"2": 0.5, "1": 0.5}

    llm = ScriptedLLM(default="", choices=choices)
    judge = SideBySideJudge(ChatClient(llm, role="judge"), score_from="logits")
    verdict = judge.judge(query="q", reference="1889", first=RIGHT, second=WRONG)
    assert verdict.scores is not None
    assert math.isclose(verdict.scores[0], 4.8) and math.isclose(verdict.scores[1], 1.5)
    assert len(llm.calls) == 2


def test_the_judge_table_selects_the_paired_mode() -> None:
    client = ChatClient(ScriptedLLM(default=""), role="judge")
    assert build_paired_judge(section=JudgeSection(), client=client, seed=0) is None
    built = build_paired_judge(section=JudgeSection(paired="side_by_side", both_orders=True, score_from="reply"),
                               client=client, seed=7)
    assert built is not None and built.both_orders and built.seed == 7
    with pytest.raises(ConfigError, match="paired"):
        config_from_dict({"judge": {"paired": "sidebyside"}})
    with pytest.raises(ConfigError, match="both_orders"):
        JudgeSection(both_orders=True)


def test_a_batch_of_pairs_is_judged_concurrently_up_to_the_backends_limit_in_order() -> None:
    import threading
    import time

    lock, now = threading.Lock(), [0]
    peak = [0]

    def slow(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return fair_judge(messages, options)

    judge, llm = _judge(slow)
    llm.max_concurrency = 3
    pairs = [{"query": f"When was tower {i} completed?", "reference": "In 1889.",
              "first": RIGHT if i % 2 else WRONG, "second": WRONG if i % 2 else RIGHT} for i in range(9)]
    verdicts = judge.judge_many(pairs)
    assert [v.scores for v in verdicts] == [(5, 2) if i % 2 else (2, 5) for i in range(9)]
    assert peak[0] == 3  # as many in flight as the backend takes, never more
