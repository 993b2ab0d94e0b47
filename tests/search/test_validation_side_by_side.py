"""The validation stage under ``[judge].paired = "side_by_side"`` (opro/search/paired.py): its test reads
one side-by-side call per confirmation question, and a rerun asks nothing."""

from __future__ import annotations

import re
from pathlib import Path

from fakes import experiment_config, scripted_pool, side_by_side_judge_reply

from opro.config import config_from_dict
from opro.experiment import Experiment
from opro.llm.scripted import ScriptedLLM


def test_the_validation_stage_decides_on_side_by_side_scores_and_a_rerun_makes_no_call(tmp_path: Path) -> None:
    cfg = config_from_dict(experiment_config(tmp_path, judge={"paired": "side_by_side"}), base_dir=tmp_path,
                           source="test.toml")
    judge = ScriptedLLM(default=side_by_side_judge_reply, model="judge")
    first = Experiment(cfg, pool=scripted_pool(judge=judge), progress=False)
    try:
        r = first.optimize()
    finally:
        first.close()
    v = r.validation
    assert v is not None
    chosen = next(f for f in v.finalists if f.chosen)
    # pointwise the finalist scores 5 and the initial instruction 2; side by side 4 against 3
    assert set(chosen.scores) == {4.0} and set(v.initial_scores) == {3.0}
    assert chosen.difference == 1.0 and chosen.n_pairs == len(chosen.scores) == 11
    paired = [m[-1].content for m, _ in judge.calls if "Answer A: " in m[-1].content]
    assert len(paired) == chosen.n_pairs  # one call per confirmation question
    firsts = {re.search(r"^Answer A: (.*)$", text, re.M).group(1) for text in paired}  # type: ignore[union-attr]
    assert len(firsts) == 2  # the order is drawn per question: each prompt's answer is shown first somewhere

    pool = scripted_pool()
    again = Experiment(cfg, pool=pool, progress=False)
    try:
        r2 = again.optimize()
    finally:
        again.close()
    assert again.usage.total_calls() == 0
    assert r2.validation is not None and r2.validation.initial_scores == v.initial_scores
    assert next(f for f in r2.validation.finalists if f.chosen).scores == chosen.scores
