"""The judge contract: every judge the factory builds (opro.judges.factory) passes the same suite.

In the spirit of Optuna's storage tests (one suite, every implementation): the cases are read from
the factory's own tables (each built-in correctness template x each score source, each judge of
``METRIC_JUDGES``), so a judge registered there is covered without editing this file, and fails
here until its scripted replies are added to ``SCRIPTS``. The last tests check that the factory is
the only place in opro that builds a judge.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import opro
import opro.judges
from opro.config import JudgeSection
from opro.errors import ConfigError, LLMBadRequestError, LLMError
from opro.judges import (
    BUILTIN_TEMPLATES,
    METRIC_JUDGES,
    SCORE_SOURCES,
    CorrectnessJudge,
    build_judge,
    build_metric,
    judge_template,
    make_extra_metrics,
)
from opro.judges.metrics import Metric, MetricResult
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
    "faithfulness": Script(
        good='{"answer": "YES"}',
        good_score=1.0,
        good_passing=True,
        score_range=(0.0, 1.0),
        unreadable='{"answer": "MAYBE"}',
    ),
    "relevancy": Script(
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
    from opro.tracking.genai import mlflow_correctness_judge

    return mlflow_correctness_judge(client)


CASES = _cases()


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request: pytest.FixtureRequest) -> JudgeCase:
    return request.param  # type: ignore[no-any-return]


def _backend(case: JudgeCase, *, reply: str, probs: Mapping[str, float]) -> ScriptedLLM:
    choices = (lambda messages, prefix: probs) if case.backend == "logits" else None
    return ScriptedLLM(default=reply, choices=choices)


def _script(judge: Metric) -> Script:
    if judge.name not in SCRIPTS:
        pytest.fail(
            f"judge {judge.name!r} is built by the factory but has no Script in tests/judges/test_judges_contract.py: "
            "add a good and an unreadable reply as its model writes them"
        )
    return SCRIPTS[judge.name]


def _judge(case: JudgeCase, llm: ScriptedLLM, *, cache: CallCache | None = None) -> Metric:
    judge = case.build(client=ChatClient(llm, role="judge", cache=cache))
    assert isinstance(judge, Metric)
    return judge


def _case_script(case: JudgeCase) -> Script:
    # The script is chosen by the judge's name, which needs a judge: one on a backend never called.
    return _script(_judge(case, _backend(case, reply="", probs={})))


def _good(case: JudgeCase) -> ScriptedLLM:
    return _backend(case, reply=_case_script(case).good, probs=GOOD_SCORE_PROBS)


def _measure(judge: Metric, **changes: object) -> MetricResult:
    return judge.measure(**{**ITEM, **changes})  # type: ignore[arg-type]


# --- the contract ------------------------------------------------------------------------------------


def test_a_good_reply_gives_its_score_in_range(case: JudgeCase) -> None:
    llm = _good(case)
    judge = _judge(case, llm)
    script = _script(judge)
    result = _measure(judge)
    assert isinstance(result, MetricResult) and result.name == judge.name
    assert not result.invalid and result.invalid_reason is None
    low, high = script.score_range
    assert result.score is not None and low <= result.score <= high
    assert result.score == pytest.approx(script.good_score) and result.passing is script.good_passing
    assert llm.calls  # the judge asked its model (not a score from nowhere)


def test_an_unreadable_reply_is_an_invalid_result_not_a_score(case: JudgeCase) -> None:
    judge = _judge(case, _backend(case, reply=_case_script(case).unreadable, probs=UNREADABLE_SCORE_PROBS))
    result = _measure(judge)  # no exception
    assert result.name == judge.name
    assert result.invalid and result.score is None and result.passing is None
    assert result.invalid_reason  # says why


def test_the_same_inputs_make_the_same_request(case: JudgeCase) -> None:
    first, second, other = _good(case), _good(case), _good(case)
    a, b = _measure(_judge(case, first)), _measure(_judge(case, second))
    assert first.calls and first.calls == second.calls and a == b
    # ...and a different answer a different one: the cache key follows the inputs.
    _measure(_judge(case, other), answer="AlexNet used sigmoid activations.")
    assert other.calls != first.calls


def test_a_repeated_measure_is_answered_by_the_call_cache(case: JudgeCase, tmp_path: Path) -> None:
    llm = _good(case)
    cache = CallCache(tmp_path / "calls.sqlite")
    try:
        first = _measure(_judge(case, llm, cache=cache))
        asked = len(llm.calls)
        again = _measure(_judge(case, llm, cache=cache))  # a second judge with the same settings
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
    judge = _judge(case, llm)
    with pytest.raises(LLMError) as raised:
        _measure(judge)
    assert raised.value.permanent and raised.value.role == "judge"


# --- the factory ----------------------------------------------------------------------------------


def test_the_cases_cover_every_judge_the_factory_builds() -> None:
    built = {_judge(c, _backend(c, reply="", probs={})).name for c in CASES}
    assert built == {"correctness", *METRIC_JUDGES, "mlflow_correctness"} and built <= set(SCRIPTS)
    assert len(CASES) == (len(BUILTIN_TEMPLATES) * (len(SCORE_SOURCES) * len(BACKENDS) - 1)
                          + 2 * len(METRIC_JUDGES) + len(BACKENDS))


def test_build_judge_reads_every_field_of_the_judge_table() -> None:
    section = JudgeSection(template="rubric", threshold=3.5, structured=False, expected_score=True,
                           max_tokens=64, score_from="reply")
    judge = build_judge(section=section, client=ChatClient(ScriptedLLM(default=""), role="judge"))
    assert judge.template is BUILTIN_TEMPLATES["rubric"]
    assert (judge.threshold, judge.structured, judge.expected_score, judge.max_tokens, judge.score_from) == (
        3.5, False, True, 64, "reply")


def test_the_agreement_judge_keeps_the_judge_defaults() -> None:
    """`opro judge agreement` builds its judge from a [judge] table holding only --template and
    --score-from: the other settings are the judge's own defaults, as before the factory."""
    client = ChatClient(ScriptedLLM(default=""), role="judge")
    built = build_judge(section=JudgeSection(template="fewshot", score_from="reply"), client=client)
    direct = CorrectnessJudge(client, template="fewshot", score_from="reply")
    fields = ("template", "threshold", "structured", "reasoning_first", "expected_score", "max_tokens",
              "temperature", "score_from", "min_score_mass")
    assert {f: getattr(built, f) for f in fields} == {f: getattr(direct, f) for f in fields}


def test_a_template_file_is_placed_by_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.toml").write_text('name = "mine"\nuser = "Q: {query}\\nA: {generated_answer}\\nR: {reference_answer}"\n')
    client = ChatClient(ScriptedLLM(default=""), role="judge")
    section = JudgeSection(template="mine.toml", score_from="reply")
    # An experiment resolves it against its config's folder...
    assert judge_template(section=section, resolve=lambda p: tmp_path / p) == tmp_path / "mine.toml"
    assert build_judge(section=section, client=client, resolve=lambda p: tmp_path / p).template.name == "mine"
    # ...the command line reads it as written, from the working directory.
    assert judge_template(section=section) == "mine.toml"
    with pytest.raises(ConfigError, match=r"unknown judge template 'mine\.toml'"):
        build_judge(section=section, client=client)
    monkeypatch.chdir(tmp_path)
    assert build_judge(section=section, client=client).template.name == "mine"
    # A built-in name is never resolved as a path.
    assert judge_template(section=JudgeSection(template="rubric"), resolve=lambda p: tmp_path / p) == "rubric"


def test_logit_scores_need_a_backend_that_reads_logits() -> None:
    with pytest.raises(ConfigError, match=r"score_from='logits' needs a backend that reads next-token logits"):
        build_judge(section=JudgeSection(score_from="logits"), client=ChatClient(ScriptedLLM(default=""), role="judge"))


def test_an_unknown_judge_metric_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown judge metric 'bleu'; choose from faithfulness, relevancy"):
        build_metric("bleu", client=ChatClient(ScriptedLLM(default=""), role="judge"))


def test_extra_metrics_by_name_ask_for_the_judge_client_only_for_a_judge() -> None:
    from opro.judges.metrics import TokenF1

    asked: list[ChatClient] = []

    def judge_client() -> ChatClient:
        asked.append(ChatClient(ScriptedLLM(default=""), role="judge"))
        return asked[-1]

    assert [type(m) for m in make_extra_metrics(["token_f1", " ", "Token-F1"], judge_client=judge_client)] == [TokenF1] * 2
    assert asked == []
    built = make_extra_metrics(["faithfulness", "relevancy"], judge_client=judge_client)
    assert [m.name for m in built] == ["faithfulness", "relevancy"] and len(asked) == 2
    with pytest.raises(ConfigError, match=r"unknown extra metric 'bleu'; choose from faithfulness, relevancy, token_f1"):
        make_extra_metrics(["bleu"], judge_client=judge_client)


# --- the factory is the only construction site ---------------------------------------------------


def _judge_classes() -> set[str]:
    """The judge classes opro.judges defines (a ``measure`` method, or a name ending in Judge)."""
    names: set[str] = set()
    for info in pkgutil.iter_modules(opro.judges.__path__):
        module = importlib.import_module(f"opro.judges.{info.name}")
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and not getattr(obj, "_is_protocol", False) and (
                obj.__name__.endswith("Judge") or callable(getattr(obj, "measure", None))
            ):  # a Protocol (the Metric interface) is no judge: nothing constructs it
                names.add(obj.__name__)
    return names


def _constructions(source: str, judges: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each call of a judge class in ``source``, under its own name or an alias."""
    tree = ast.parse(source)
    aliases = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names if a.name in judges}
    called = {**{j: j for j in judges}, **aliases}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in called:
                found.append((node.lineno, called[name]))
    return found


def test_the_construction_finder_finds_constructions() -> None:
    judges = _judge_classes()
    assert {"CorrectnessJudge", "FaithfulnessJudge", "RelevancyJudge", "_YesNoJudge"} <= judges
    assert "JudgeTemplate" not in judges
    source = (
        "from opro.judges import FaithfulnessJudge as F\n"
        "import opro.judges\n"
        "a = CorrectnessJudge(client, template='rubric')\n"
        "b = F(client)\n"
        "c = opro.judges.RelevancyJudge(client)\n"
        "d = build_judge(section=s, client=client)\n"
    )
    assert _constructions(source, judges) == [(3, "CorrectnessJudge"), (4, "FaithfulnessJudge"), (5, "RelevancyJudge")]


def test_judges_are_built_only_by_the_factory() -> None:
    package = Path(opro.__file__).parent
    judges = _judge_classes()
    elsewhere = [
        f"{path.relative_to(package.parent)}:{line}: {name}(...)"
        for path in sorted(package.rglob("*.py"))
        if package / "judges" not in path.parents
        for line, name in _constructions(path.read_text(encoding="utf-8"), judges)
    ]
    assert not elsewhere, (
        "judges built outside opro/judges/factory.py; use build_judge(section=..., client=...) or "
        "build_metric(name, client=...) (and register a new kind in METRIC_JUDGES): " + "; ".join(elsewhere)
    )
