"""The validation decision's design, typed: its stored form and its key are the ones written before it
had a type, so stored studies, ledgers and keys read back and match."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from fakes import Ex

from opro.config import OptimizerSection
from opro.experiment.settings import validation_settings
from opro.search.design import EarlierDecision, ValidationDesign
from opro.search.results import CandidateRecord, CostSaving
from opro.search.study import questions_key, sha
from opro.search.validation import _design, _plan
from opro.stats.sequential import Look

PROCEDURE = ("chosen finalist vs initial: sequential one-sided betting confidence sequence for a bounded mean "
             "(Waudby-Smith & Ramdas 2024) on the judge's 1-5 scale, valid at every look, non-binding futility")
#: The procedure of issues 61-66 (Hall's statistic flipped): such designs still load.
HALL_PROCEDURE = ("chosen finalist vs initial: group-sequential one-sided sign-flip test of Hall's skew-corrected "
                  "studentized mean, O'Brien-Fleming-type alpha spending, non-binding futility")
#: The procedure before issue 61 (the sum of the differences flipped): such designs still load.
SUM_PROCEDURE = ("chosen finalist vs initial: group-sequential one-sided sign-flip test, "
                 "O'Brien-Fleming-type alpha spending, non-binding futility")


def old_key(design: dict[str, Any]) -> str:
    """The key as the validation stage computed it from the design's dict, before the design had a type:
    every entry but the key, and but min_coverage at 0.9, as sorted (name, repr) pairs."""
    kept = sorted((k, repr(v)) for k, v in design.items()
                  if k != "key" and not (k == "min_coverage" and v == 0.9))
    return sha(repr(kept))


def made(settings: OptimizerSection, *, n_extension: int = 0) -> tuple[ValidationDesign, list[str], list[str]]:
    """The design the validation stage makes for 2 finalists on 12 validation questions (and
    ``n_extension`` questions in no split), and those questions."""
    finalists = [CandidateRecord(step=1, instruction=f"Finalist {i}.", score=4.0 - i, n_scored=4, n_invalid=0,
                                 n_errors=0, status="complete", trial_number=i) for i in range(2)]
    validation = [f"val question {i}?" for i in range(12)]
    extension = [f"unused question {i}?" for i in range(n_extension)]
    design = validation_settings(settings)
    plan = _plan(design, initial="Answer the question.", finalists=finalists,
                 validation_set=[Ex(q, "a") for q in validation], extension_set=[Ex(q, "a") for q in extension])
    return _design(design, plan), validation, extension


def test_a_quality_design_is_stored_as_before_and_reads_back() -> None:
    design, validation, _ = made(OptimizerSection(alpha=0.05, finalists=2, selection_questions=4))
    # The dict the validation stage stored before the design had a type, in its order.
    before: dict[str, Any] = {
        "alpha": 0.05, "looks": 3, "futility": True, "selection_questions": 4,
        "finalists": ["Finalist 0.", "Finalist 1."], "initial": "Answer the question.", "n_questions": 12,
        "procedure": PROCEDURE, "questions": questions_key(validation), "futility_from_look": 1, "min_coverage": 0.9,
    }
    before["key"] = old_key(before)
    stored = design.to_json()
    assert stored == before and list(stored) == list(before)
    assert ValidationDesign.from_json(stored) == design and ValidationDesign.from_json(stored).to_json() == stored
    assert design.summary_json() == {k: v for k, v in before.items() if k not in ("finalists", "initial")}


def test_a_decision_of_the_sign_flips_loads_but_is_never_resumed_under_the_betting_test() -> None:
    """Issue 61 changed the statistic the validation stage flips, and the betting test replaced the flips,
    and so what a stored decision means: a design recorded before (its procedure flips the sum, or
    Hall's statistic) reads back and keys as stored, but the design made now on the same questions and
    settings has another key, so that decision is refused (or, with ``seen_validation = "label"``,
    re-decided), never resumed; and no look continues a look of another test."""
    from opro.stats.sequential import decide

    design, _, _ = made(OptimizerSection(alpha=0.05, finalists=2, selection_questions=4))
    stored = {**design.to_json(), "procedure": SUM_PROCEDURE}
    stored["key"] = old_key(stored)
    earlier = ValidationDesign.from_json(stored)
    assert earlier.keyed() == earlier and earlier.procedure == SUM_PROCEDURE
    assert earlier.key != design.key and "betting confidence sequence" in design.procedure
    hall = {**design.to_json(), "procedure": HALL_PROCEDURE}
    hall["key"] = old_key(hall)
    assert ValidationDesign.from_json(hall).key != design.key  # a decision of Hall's flips is not resumed either
    old_look = Look(look=1, n=4, n_max=12, statistic=4.0, mean_difference=1.0, boundary=math.inf, alpha_spent=0.001,
                    p_value=0.06, decision="continue")
    assert "statistic_of" not in old_look.as_dict() and Look.from_dict(old_look.as_dict()) == old_look
    with pytest.raises(ValueError, match="another test"):
        decide([1.0] * 8, seen=[4, 8], n_max=12, last=False, earlier=[old_look], alpha=0.05, scale=(1.0, 5.0))
    hall_look = Look(look=1, n=4, n_max=12, statistic=4.0, mean_difference=1.0, boundary=math.inf, alpha_spent=0.001,
                     p_value=0.06, decision="continue", statistic_of="hall")
    with pytest.raises(ValueError, match="another test"):
        decide([1.0] * 8, seen=[4, 8], n_max=12, last=False, earlier=[hall_look], alpha=0.05, scale=(1.0, 5.0))


def test_a_cost_design_with_an_extension_is_stored_as_before_and_reads_back() -> None:
    settings = OptimizerSection(objective="cost", margin=0.25, min_coverage=0.8, futility=False, validation_extension=5)
    design, validation, extension = made(settings, n_extension=8)
    assert design.objective == "cost" and design.extension == 5 and design.futility_from_look is None
    before: dict[str, Any] = {
        # Under cost the finalist is chosen on the search and selection questions paired with the initial
        # configuration (issue 57); a design recorded before, without selection questions, has another key.
        "alpha": 0.05, "looks": design.looks, "futility": False, "selection_questions": 4,
        "finalists": ["Finalist 0.", "Finalist 1."], "initial": "Answer the question.", "n_questions": 12,
        "procedure": design.procedure, "questions": questions_key(validation),
        "extension": 5, "extension_questions": questions_key(extension[:5]), "objective": "cost", "margin": 0.25,
        "min_coverage": 0.8,
    }
    before["key"] = old_key(before)
    stored = design.to_json()
    assert stored == before and list(stored) == list(before)
    assert "non-inferiority by the margin" in design.procedure
    assert ValidationDesign.from_json(stored) == design and ValidationDesign.from_json(stored).to_json() == stored


def test_a_re_decided_design_has_its_own_key_as_before() -> None:
    design, _, _ = made(OptimizerSection())
    labelled = replace(design, re_decided=True).keyed()
    # The stage added the entry to the keyed dict and keyed it again: the entry after the key.
    before = {**design.to_json(), "re_decided": True}
    assert labelled.to_json() == {**before, "key": old_key(before)} and list(labelled.to_json()) == list(before)
    assert labelled.key != design.key
    assert ValidationDesign.from_json(labelled.to_json()) == labelled


def test_an_older_design_reads_back_with_its_stored_key() -> None:
    """A design recorded before min_coverage, the futility rule's first look, extensions and objectives
    were part of it: those entries stay absent, and its key is the one it was stored with."""
    older: dict[str, Any] = {
        "alpha": 0.05, "looks": 3, "futility": True, "selection_questions": 4,
        "finalists": ["Finalist 0."], "initial": "Answer.", "n_questions": 36, "procedure": PROCEDURE,
        "questions": "0123456789abcdef", "key": "stored-as-it-was",
    }
    design = ValidationDesign.from_json(older)
    assert design.key == "stored-as-it-was" and design.to_json() == older
    assert design.min_coverage is None and design.extension is None and design.objective is None
    assert not design.re_decided
    # Keyed again, it gets the key the old stage gave it; at min_coverage 0.9 the same one (it is left out).
    assert design.keyed().key == old_key(older) == replace(design, min_coverage=0.9).keyed().key
    assert replace(design, min_coverage=0.8).keyed().key != old_key(older)


def test_an_earlier_decision_is_stored_as_before() -> None:
    design, _, _ = made(OptimizerSection())
    looks = (Look(look=1, n=3, n_max=8, statistic=3.0, mean_difference=1.0, boundary=math.inf, alpha_spent=0.001,
                  p_value=0.125, decision="continue"),
             Look(look=2, n=8, n_max=8, statistic=9.0, mean_difference=1.125, boundary=8.0, alpha_spent=0.05,
                  p_value=0.01, decision="success"))
    stored = {"design": design.to_json(), "looks": [x.as_dict() for x in looks]}
    assert EarlierDecision(design=design, looks=looks).to_json() == stored
    assert EarlierDecision.from_json(stored) == EarlierDecision(design=design, looks=looks)


def test_a_cost_saving_is_shown_as_before() -> None:
    saving = CostSaving(unit="tokens", n_pairs=4, initial_cost=20.0, difference=-5.0, difference_ci=(-7.0, -3.0),
                        relative=0.25, relative_ci=(0.15, 0.35), lower=True)
    assert saving.as_dict() == {
        "unit": "tokens", "n_pairs": 4, "initial_cost": 20.0, "difference": -5.0, "difference_ci": [-7.0, -3.0],
        "relative": 0.25, "relative_ci": [0.15, 0.35], "lower": True,
    }
    assert replace(saving, difference_ci=None, relative_ci=None).as_dict()["relative_ci"] is None


def test_under_cost_the_selection_questions_are_asked_of_the_initial_configuration_too() -> None:
    """Issue 57: the cost choice is paired on the selection questions, so the initial configuration answers
    them beside the finalists, and the call budget and the plan count its answers."""
    from opro.search.validation_sizes import max_calls, selection_prompts, split_sizes

    quality = validation_settings(OptimizerSection(finalists=2))
    cost = validation_settings(OptimizerSection(finalists=2, objective="cost", margin=0.25))
    assert split_sizes(quality, 52, 2) == split_sizes(cost, 52, 2) == (4, 48)
    assert split_sizes(cost, 52, 1) == (0, 52)  # one finalist: nothing to choose
    assert (selection_prompts(quality, 2), selection_prompts(cost, 2)) == (2, 3)
    # 3 looks over 48 confirmation questions and up to 20 more: 68 pairs at most, 2 calls an answer.
    assert max_calls(quality, 52, 20) == 2 * (2 * 4 + 2 * 68)
    assert max_calls(cost, 52, 20) == 2 * (3 * 4 + 2 * 68)


def test_the_confirmation_asks_a_clusters_questions_together_and_never_one_that_chose() -> None:
    """Questions on the same passage (their reference context) are one cluster: the confirmation asks
    them one after the other, leaves out those whose passage a selection question shares (they chose the
    finalist too), and the design names the clusters; without passages, the plan and key are as before."""
    from opro.data.dataset import Example

    finalists = [CandidateRecord(step=1, instruction=f"Finalist {i}.", score=4.0 - i, n_scored=4, n_invalid=0,
                                 n_errors=0, status="complete", trial_number=i) for i in range(2)]
    passages = ["p0", "p1", "p2", "p1", "p3", "p2", "p4", "p3", "p0", "p5", "p4", "p5"]
    validation = [Example(query=f"val question {i}?", reference_answer="a", reference_contexts=(p,))
                  for i, p in enumerate(passages)]
    settings = validation_settings(OptimizerSection(alpha=0.05, finalists=2, selection_questions=4))
    plan = _plan(settings, initial="Answer the question.", finalists=finalists, validation_set=validation,
                 extension_set=[])
    selection = [e.reference_contexts[0] for e in plan.selection]
    assert selection == ["p0", "p0", "p1", "p1"]
    assert [e.reference_contexts[0] for e in plan.confirmation] == ["p2", "p2", "p3", "p3", "p4", "p4", "p5", "p5"]
    assert plan.clustered and "over the means of 4 clusters" in _design(settings, plan).procedure
    bare = [Example(query=e.query, reference_answer="a") for e in validation]
    plain = _plan(settings, initial="Answer the question.", finalists=finalists, validation_set=bare, extension_set=[])
    assert [e.query for e in plain.confirmation] == [e.query for e in bare[4:]] and not plain.clustered
    assert _design(settings, plain).procedure == PROCEDURE
