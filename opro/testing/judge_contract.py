"""The judge contract: every judge the factory builds (:mod:`opro.judges.factory`) passes the same suite.

In the spirit of Optuna's storage tests (one suite, every implementation): the cases are read from the
factory's own tables (each built-in correctness template x each score source, each judge of
``METRIC_JUDGES``, MLflow's correctness judge), so a judge registered there is covered without editing
the suite, and fails here until its scripted replies are added to :data:`SCRIPTS`. A judge reads a good
reply as its score in range, an unreadable one as an invalid result (never a score), makes the same
request for the same inputs, is answered by the call cache the second time, and lets a permanent LLM
error through. Run it by importing the tests::

    from opro.testing.judge_contract import *  # noqa: F403
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from opro.config import JudgeSection
from opro.errors import LLMBadRequestError, LLMError
from opro.judges import BUILTIN_TEMPLATES, METRIC_JUDGES, SCORE_SOURCES, build_judge, build_metric
from opro.judges.metrics import Metric, MetricResult
from opro.judges.yesno import FaithfulnessJudge, RelevancyJudge
from opro.llm import ChatClient, Message
from opro.llm.cache import CallCache
from opro.llm.scripted import ScriptedLLM

# One question as the RAG program leaves it: the judges read what they need of it.
ITEM: Mapping[str, object] = {
    "query": "Which activation function did AlexNet use?",
    "answer": "AlexNet used ReLU activations, which trained several times faster than tanh.",
    "reference": "AlexNet used the ReLU non-linearity.",
    "contexts": (
        "We refer to neurons with this nonlinearity as Rectified Linear Units (ReLUs).",
        "Deep convolutional neural networks with ReLUs train several times faster than their tanh equivalents.",
    ),
}

# A backend that generates text only (a chat API), and one that also reads next-token logits (llama.cpp).
BACKENDS = ("chat", "logits")

#: Next-token probabilities at the score position: most mass on "4"; then most mass off the scores
#: (the judge meant to write something else), which the logit judge must not read as a score.
GOOD_SCORE_PROBS: Mapping[str, float] = {"4": 0.97}
UNREADABLE_SCORE_PROBS: Mapping[str, float] = {"4": 0.2}


@dataclass(frozen=True)
class Script:
    """Replies as a judge model writes them, and what the judge must make of them."""

    good: str
    good_score: float
    good_passing: bool
    score_range: tuple[float, float]
    #: A reply with no verdict in it (a digit or a verdict-like word where no verdict sits).
    unreadable: str


SCRIPTS: Mapping[str, Script] = {
    "correctness": Script(
        good='{"score": 4, "reasoning": "Same fact as the reference (ReLU); the speed claim is extra."}',
        good_score=4.0,
        good_passing=True,
        score_range=(1.0, 5.0),
        unreadable="The answer gets a score of 4.",  # prose, not a label: parse_score refuses it
    ),
    FaithfulnessJudge.name: Script(
        good='{"answer": "YES"}',
        good_score=1.0,
        good_passing=True,
        score_range=(0.0, 1.0),
        unreadable='{"answer": "MAYBE"}',
    ),
    RelevancyJudge.name: Script(
        good="NO",
        good_score=0.0,
        good_passing=False,
        score_range=(0.0, 1.0),
        unreadable="The response mentions tanh, which the question does not ask about.",
    ),
    "mlflow_correctness": Script(
        good='{"rationale": "Let\'s think step by step. ReLU is in the document.", "result": "yes"}',
        good_score=5.0,
        good_passing=True,
        score_range=(1.0, 5.0),
        unreadable="The claim is mostly supported.",
    ),
}


@dataclass(frozen=True)
class JudgeCase:
    id: str
    backend: str
    build: Callable[..., Metric]  # called with client=ChatClient


def _cases() -> list[JudgeCase]:
    cases = []
    for template in BUILTIN_TEMPLATES:
        for score_from in SCORE_SOURCES:
            for backend in BACKENDS:
                if score_from == "logits" and backend == "chat":
                    continue  # refused when built: test_logit_scores_need_a_backend_that_reads_logits
                section = JudgeSection(template=template, score_from=score_from)  # type: ignore[arg-type]
                cases.append(
                    JudgeCase(f"correctness-{template}-{score_from}-{backend}", backend,
                              functools.partial(build_judge, section=section))
                )
    for name in METRIC_JUDGES:
        for backend in BACKENDS:
            cases.append(JudgeCase(f"{name}-{backend}", backend, functools.partial(build_metric, name)))
    for backend in BACKENDS:  # MLflow's judge, with the prompt tracking hands it (the installed MLflow's)
        cases.append(JudgeCase(f"mlflow_correctness-{backend}", backend, _mlflow_correctness))
    return cases


def _mlflow_correctness(*, client: ChatClient) -> Metric:
    from opro.tracking.scorers import mlflow_correctness_judge

    return mlflow_correctness_judge(client)


CASES = _cases()


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request: pytest.FixtureRequest) -> JudgeCase:
    return request.param  # type: ignore[no-any-return]


def backend_of(case: JudgeCase, *, reply: str, probs: Mapping[str, float]) -> ScriptedLLM:
    choices = (lambda messages, prefix: probs) if case.backend == "logits" else None
    return ScriptedLLM(default=reply, choices=choices)


def _script(judge: Metric) -> Script:
    if judge.name not in SCRIPTS:
        pytest.fail(
            f"judge {judge.name!r} is built by the factory but has no Script in opro/testing/judge_contract.py: "
            "add a good and an unreadable reply as its model writes them"
        )
    return SCRIPTS[judge.name]


def judge_of(case: JudgeCase, llm: ScriptedLLM, *, cache: CallCache | None = None) -> Metric:
    judge = case.build(client=ChatClient(llm, role="judge", cache=cache))
    assert isinstance(judge, Metric)
    return judge


def _case_script(case: JudgeCase) -> Script:
    # The script is chosen by the judge's name, which needs a judge: one on a backend never called.
    return _script(judge_of(case, backend_of(case, reply="", probs={})))


def _good(case: JudgeCase) -> ScriptedLLM:
    return backend_of(case, reply=_case_script(case).good, probs=GOOD_SCORE_PROBS)


def _measure(judge: Metric, **changes: object) -> MetricResult:
    return judge.measure(**{**ITEM, **changes})  # type: ignore[arg-type]


# --- the contract ------------------------------------------------------------------------------------


def test_a_good_reply_gives_its_score_in_range(case: JudgeCase) -> None:
    llm = _good(case)
    judge = judge_of(case, llm)
    script = _script(judge)
    result = _measure(judge)
    assert isinstance(result, MetricResult) and result.name == judge.name
    assert not result.invalid and result.invalid_reason is None
    low, high = script.score_range
    assert result.score is not None and low <= result.score <= high
    assert result.score == pytest.approx(script.good_score) and result.passing is script.good_passing
    assert llm.calls  # the judge asked its model (not a score from nowhere)


def test_an_unreadable_reply_is_an_invalid_result_not_a_score(case: JudgeCase) -> None:
    judge = judge_of(case, backend_of(case, reply=_case_script(case).unreadable, probs=UNREADABLE_SCORE_PROBS))
    result = _measure(judge)  # no exception
    assert result.name == judge.name
    assert result.invalid and result.score is None and result.passing is None
    assert result.invalid_reason  # says why


def test_the_same_inputs_make_the_same_request(case: JudgeCase) -> None:
    first, second, other = _good(case), _good(case), _good(case)
    a, b = _measure(judge_of(case, first)), _measure(judge_of(case, second))
    assert first.calls and first.calls == second.calls and a == b
    # ...and a different answer a different one: the cache key follows the inputs.
    _measure(judge_of(case, other), answer="AlexNet used sigmoid activations.")
    assert other.calls != first.calls


def test_a_repeated_measure_is_answered_by_the_call_cache(case: JudgeCase, tmp_path: Path) -> None:
    llm = _good(case)
    cache = CallCache(tmp_path / "calls.sqlite")
    try:
        first = _measure(judge_of(case, llm, cache=cache))
        asked = len(llm.calls)
        again = _measure(judge_of(case, llm, cache=cache))  # a second judge with the same settings
    finally:
        cache.close()
    assert asked > 0 and len(llm.calls) == asked
    assert again == first


def test_a_permanent_llm_error_propagates(case: JudgeCase) -> None:
    """Documented by every judge: LLM errors propagate (the batch runner isolates them per item)."""

    def refuse(messages: tuple[Message, ...], prefix: str) -> Mapping[str, float]:
        raise LLMBadRequestError("model 'judge' not found", model="judge", provider="scripted")

    # No reply scripted: ScriptedLLM raises LLMBadRequestError (permanent) for every call.
    llm = ScriptedLLM(choices=refuse if case.backend == "logits" else None)
    judge = judge_of(case, llm)
    with pytest.raises(LLMError) as raised:
        _measure(judge)
    assert raised.value.permanent and raised.value.role == "judge"


__all__ = [
    "BACKENDS",
    "CASES",
    "SCRIPTS",
    "JudgeCase",
    "Script",
    "backend_of",
    "case",
    "judge_of",
    "test_a_good_reply_gives_its_score_in_range",
    "test_a_permanent_llm_error_propagates",
    "test_a_repeated_measure_is_answered_by_the_call_cache",
    "test_an_unreadable_reply_is_an_invalid_result_not_a_score",
    "test_the_same_inputs_make_the_same_request",
]
