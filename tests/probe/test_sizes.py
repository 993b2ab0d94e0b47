"""How many validation questions a claim needs, and what the held-out split detects, under the betting test."""

from __future__ import annotations

import numpy as np
import pytest

from opro.config import OptimizerSection
from opro.experiment.settings import validation_settings
from opro.probe.sizes import heldout_detectable, needed_for, questions_needed
from opro.stats import betting
from opro.stats.sequential import claim_rate, design_power, look_sizes

SCALE = (1.0, 5.0)


def _three_looks(n: int) -> tuple[int, ...]:
    return look_sizes(n, 3)


def _needed(gain: float, sd: float, *, most: int = 400) -> int | None:
    return questions_needed(_three_looks, gain=gain, fewest=6, alpha=0.05, sd=sd, scale=SCALE, most=most)


def test_the_questions_needed_fall_with_the_gain_and_rise_with_the_noise() -> None:
    by_gain = [_needed(g, 1.0) for g in (0.4, 0.5, 0.7, 1.0)]
    assert all(n is not None for n in by_gain)
    assert by_gain == sorted(by_gain, reverse=True) and by_gain[0] > by_gain[-1]  # type: ignore[type-var]
    by_sd = [_needed(0.5, sd) for sd in (0.5, 0.8, 1.2)]
    assert by_sd == sorted(by_sd) and by_sd[0] < by_sd[-1]  # type: ignore[type-var]
    # Beyond the cap: none, not the cap.
    assert _needed(0.1, 1.3, most=200) is None


def test_the_questions_needed_are_the_design_size_whose_detectable_gain_is_asked() -> None:
    """At the gain a 60-question design detects in 80% of runs, 60 questions are what it needs: a little
    more gain needs fewer, a little less more."""
    detectable = design_power(_three_looks(60), alpha=0.05, sd=1.0, scale=SCALE).detectable
    assert detectable is not None
    assert claim_rate(_three_looks(60), gain=detectable, alpha=0.05, sd=1.0, scale=SCALE) == pytest.approx(0.8, abs=0.02)
    assert _needed(detectable * 1.08, 1.0) <= 60 < _needed(detectable * 0.92, 1.0)  # type: ignore[operator]


def test_a_cost_claim_needs_questions_beyond_the_split_which_the_pool_and_the_extension_give() -> None:
    design = validation_settings(OptimizerSection(objective="cost", margin=0.25, validation_extension=20))
    need = needed_for(design, selection=4, confirmation=24, unused=20, confirms=0.69, sd=1.0, scale=SCALE)
    assert need is not None and need.claim == "margin" and need.target == 0.25 and need.have == 48
    assert need.questions is not None and need.questions > 48
    beyond = need.questions - 4 - 24  # asked by the extension: the 20 unused first, then the pool
    assert need.pool == beyond - 20 and need.extension == beyond
    # The design it plans: the split's looks, then one look on the questions beyond, claims in 80% of runs.
    looks = (*look_sizes(24, 3), 24 + beyond)
    rate = claim_rate(looks, gain=0.25, alpha=0.05, sd=1.0, scale=SCALE, futility_confidence=0.95, draws=2000)
    assert rate >= 0.8
    said = need.text(pool_command="opro dataset pool data --docs d.pdf")
    assert said.startswith("the split confirms a margin of 0.69 at 80% power on 48 validation questions; ")
    assert f"{need.questions} validation questions would confirm the 0.25 asked" in said
    assert f"`opro dataset pool data --docs d.pdf --pool {need.pool}`" in said
    assert f"[optimizer].validation_extension = {beyond}" in said
    # Where the split confirms the margin asked, nothing is needed.
    assert needed_for(design, selection=4, confirmation=24, unused=20, confirms=0.25, sd=1.0, scale=SCALE) is None


def test_heldout_detectable_is_the_betting_tests_and_none_where_it_cannot_claim() -> None:
    assert heldout_detectable(6, alpha=0.05, sd=1.3, scale=SCALE, sides=2) is None
    two = heldout_detectable(20, alpha=0.05, sd=1.3, scale=SCALE, sides=2)
    one = heldout_detectable(20, alpha=0.05, sd=1.3, scale=SCALE, sides=1)
    assert two is not None and one is not None and 0 < one < two
    # opro compare's own interval (alpha / 2 a side, bets tuned to the 20 pairs) excludes 0 in 80% of
    # samples of that difference.
    rows = np.clip(np.random.default_rng(7).normal(two, 1.3, size=(2000, 20)), -4, 4)
    shown = betting.claims(rows, scale=SCALE, alpha=0.025, planned=20)
    assert shown.mean() == pytest.approx(0.8, abs=0.03)


def test_the_plan_counts_source_passages_where_questions_share_them(tmp_path) -> None:
    """The tests count passages: 80 validation questions on 40 passages of two detect less than 80 on 80
    passages (at the assumed within-passage correlation 1, a passage's two questions count once), and the
    basis line says what was assumed."""
    import json

    from fakes import experiment_config

    from opro.config import config_from_dict
    from opro.probe.plan import make_plan
    from opro.probe.sizes import ASSUMED_RHO

    def plan_with(per: int):
        rows = [{"query": f"What is fact {i}?", "reference_answer": f"Fact {i}.",
                 "reference_contexts": [f"Passage {i // per}."]} for i in range(120)]
        where = tmp_path / f"per{per}"
        where.mkdir()
        path = where / "rag_dataset.json"
        path.write_text(json.dumps({"examples": rows}))
        cfg = experiment_config(where, data={"dataset": str(path), "query_field": "query", "answer_field": "reference_answer",
                                             "split": {"exemplar": 2, "optimization": 4, "validation": 80, "heldout": 30,
                                                       "seed": 1}})
        return make_plan(config_from_dict(cfg, base_dir=where, source="t.toml"))

    single, paired = plan_with(1), plan_with(2)
    assert single.clustering is None and paired.clustering is not None and ASSUMED_RHO > 0
    assert single.detectable is not None and paired.detectable is not None
    assert paired.detectable > single.detectable * 1.2
    assert single.heldout_detectable is not None and paired.heldout_detectable is not None
    assert paired.heldout_detectable > single.heldout_detectable
    said = "\n".join(paired.lines())
    assert "counted in passages, as the tests count them (120 validation questions on 60 source passages" in said
    assert "within-passage correlation 1.00: assumed, the worst case" in said
    assert not any("optimistic" in w for w in paired.warnings)
