"""experiments/bench_selection.py's measured cost world: calibrated to the paired noise it names, and
the cost objective run whole in it."""

from __future__ import annotations

import numpy as np
import pytest
from bench_selection import MEASURED_SDS, cost_power, measured_pairs, noise_for


@pytest.mark.parametrize("paired_sd", [float(np.median(MEASURED_SDS)), max(MEASURED_SDS)])
def test_the_measured_world_has_the_paired_noise_it_is_named_for(paired_sd: float) -> None:
    a, b = measured_pairs(np.random.default_rng(3), 100_000, shift=0.0, noise_sd=noise_for(paired_sd))
    assert float(np.std(b - a)) == pytest.approx(paired_sd, abs=0.01)
    assert 0.9 < float(np.std(a)) < 1.2  # one prompt's spread stays judge-like: the pairing removes the rest
    assert abs(float(np.mean(b - a))) < 0.01


def test_the_cost_objective_runs_whole_in_the_measured_world() -> None:
    rows = cost_power(seeds=2, n_opt=4, n_val=12, steps=1, k=2, design={}, world="measured")
    assert [r["world"] for r in rows] == ["equal", "worse by the margin"]
    assert rows[0]["shift"] == 0.0 and rows[1]["shift"] < -0.25  # clipping: a larger shift for -0.25 in the mean
    assert all(r["kind"] == "measured" and r["paired_sd"] == pytest.approx(0.66) for r in rows)
    assert all(0.0 <= r["p_returned"] <= 1.0 and r["calls_per_run"] > 0 for r in rows)


def test_the_settings_space_world_is_calibrated_and_runs_both_searches() -> None:
    """(f): one setting truly equal and 35% cheaper, the others 0.5 worse; the first moves evaluate it."""
    from bench_cost_space import EQUAL, INITIAL_SETTINGS, SPREAD, _pairs, calibrate, space_power, true_cost

    noise, shift = calibrate(0.66)
    equal = _pairs(np.random.default_rng(5), 100_000, shift=0.0, noise_sd=noise, spread=SPREAD)
    worse = _pairs(np.random.default_rng(5), 100_000, shift=shift, noise_sd=noise, spread=SPREAD)
    assert float(np.std(equal)) == pytest.approx(0.66, abs=0.01) and float(np.mean(worse)) == pytest.approx(-0.5, abs=0.01)
    assert 1 - true_cost(EQUAL) / true_cost(INITIAL_SETTINGS) == pytest.approx(0.35, abs=0.01)
    rows = space_power(seeds=2, n_opt=4, n_val=12, n_unused=0, steps=1, k=2, design={})
    assert [r["search"] for r in rows] == ["today", "this"]
    assert rows[1]["tried"][0] == 1.0  # a first move: evaluated whatever the seed
    assert all(0.0 <= r["equal"][0] <= 1.0 and r["calls"] > 0 for r in rows)
