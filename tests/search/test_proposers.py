"""Proposers are plug-ins: the registry builds them by name, and the reflective one rewrites the best
instruction from the judge's reasons on the exemplar questions it fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import keyword_examples as _examples
from fakes import keyword_optimizer as _optimizer

from opro.config import OptimizerSection
from opro.errors import ConfigError
from opro.experiment.settings import proposer_settings
from opro.llm import ChatClient
from opro.llm.scripted import ScriptedLLM
from opro.search import PROPOSERS, make_proposer
from opro.search.proposers import OproProposer, ReflectiveProposer


def test_the_registry_builds_each_proposer_by_its_name_and_refuses_others() -> None:
    llm = ChatClient(ScriptedLLM(), role="optimizer")
    assert isinstance(make_proposer(settings=proposer_settings(OptimizerSection()), llm=llm, template_text="<INS>"), OproProposer)
    built = make_proposer(settings=proposer_settings(OptimizerSection(proposer="reflect")), llm=llm, template_text="<INS>")
    assert isinstance(built, ReflectiveProposer)
    assert set(PROPOSERS) >= {"opro", "reflect"}
    with pytest.raises(ConfigError, match=r"\[optimizer\].proposer = 'gepa' is not a proposer; choose one of"):
        make_proposer(settings=proposer_settings(OptimizerSection(proposer="gepa")), llm=llm, template_text="<INS>")


def test_the_reflective_proposer_shows_the_failing_exemplars_with_the_judge_s_reasons(tmp_path: Path) -> None:
    opt, rig, program = _optimizer(tmp_path, proposer="reflect", steps=2, exemplars=2)
    result = opt.optimize(program=program, optimization_set=_examples(4), exemplar_set=_examples(3),  # type: ignore[arg-type]
                          initial_instructions=["Answer."])
    assert {r.step for r in result.history} == {0, 1, 2}
    prompts = sorted((tmp_path / "out" / "metaprompts").iterdir())
    assert len(prompts) == 2
    first = prompts[0].read_text()
    # The best instruction so far (the initial one) and up to 2 exemplar questions it scored below 5.
    assert "<INS>Answer.</INS>" in first and first.count("Question: question ") == 2
    assert "Grader's reason:" in first and "Reference answer: ref" in first
    # Only exemplar questions reach the optimizer: those of the optimization split are never shown.
    shown = [line for line in first.splitlines() if line.startswith("Question: ")]
    assert all(q.removeprefix("Question: ") in {e.query for e in _examples(3)} for q in shown)
    # The optimizer was asked with that prompt, and its candidates were scored.
    assert any("Questions it answered poorly" in messages[-1].content for messages, _ in rig.optimizer.calls)
    assert sum(1 for r in result.history if r.step > 0) >= 1
