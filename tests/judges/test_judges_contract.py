"""The judge contract: every judge the factory builds (opro.judges.factory) passes the same suite.

In the spirit of Optuna's storage tests (one suite, every implementation): the cases are read from
the factory's own tables (each built-in correctness template x each score source, each judge of
``METRIC_JUDGES``), so a judge registered there is covered without editing this file, and fails
here until its scripted replies are added to ``SCRIPTS``. The last tests check that the factory is
the only place in opro that builds a judge.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import opro
import opro.judges
from opro.config import JudgeSection
from opro.errors import ConfigError
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
from opro.llm import ChatClient
from opro.llm.scripted import ScriptedLLM
from opro.testing.judge_contract import *  # noqa: F403
from opro.testing.judge_contract import BACKENDS, CASES, SCRIPTS, backend_of, judge_of

# --- the factory ----------------------------------------------------------------------------------


def test_the_cases_cover_every_judge_the_factory_builds() -> None:
    built = {judge_of(c, backend_of(c, reply="", probs={})).name for c in CASES}
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
