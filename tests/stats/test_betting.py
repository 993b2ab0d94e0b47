"""The betting confidence sequence (opro.stats.betting): bounds of a mean difference of judge scores
that hold whatever the differences' shape, at every look."""

from __future__ import annotations

import numpy as np
import pytest

from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.stats.betting import bound, claimed, claims, lower_bounds, min_pairs, upper_bounds
from opro.testing.score_worlds import effect_for, paired_scores

SCALE = (SCORE_MIN, SCORE_MAX)


def test_fifteen_tied_pairs_never_show_non_inferiority_and_no_sample_claims_below_the_derived_size() -> None:
    # A first look of 15 identical scores says nothing about a rare failure: the sample that fooled
    # the sign flips (every difference the same) must not decide at margin 0.25.
    assert not claimed([0.0] * 15, scale=SCALE, alpha=0.05, above=-0.25)
    assert not claimed([0.0] * 15, scale=SCALE, alpha=0.05, above=-0.25, planned=64)
    # The smallest size at which any sample claims at all follows from alpha, the scale and the margin:
    # below it even a sample of the widest possible gains is refused, at it that sample claims.
    n = min_pairs(alpha=0.05, scale=SCALE, above=-0.25)
    assert n is not None and 1 < n < 15
    assert not claimed([SCORE_MAX - SCORE_MIN] * (n - 1), scale=SCALE, alpha=0.05, above=-0.25)
    assert claimed([SCORE_MAX - SCORE_MIN] * n, scale=SCALE, alpha=0.05, above=-0.25)
    # A larger margin or a looser alpha can only need fewer pairs, never more.
    assert min_pairs(alpha=0.05, scale=SCALE, above=-1.0) <= n  # type: ignore[operator]
    assert min_pairs(alpha=0.05, scale=SCALE, above=0.0) >= n  # type: ignore[operator]


def test_an_all_tied_sample_bounds_the_mean_by_the_scale_not_by_its_own_spread() -> None:
    # Twelve tied pairs (a pilot) have no spread; their interval must still be too wide to call the
    # difference within +-0.2, since a failure on 1 question in 12 or fewer would not show.
    b = bound([0.0] * 12, scale=SCALE, alpha=0.05)
    assert b.mean == 0.0 and b.low < -0.2 and b.high > 0.2 and b.low == pytest.approx(-b.high)


def test_the_bounds_cover_the_true_mean_at_every_look_in_skewed_and_tied_worlds() -> None:
    # Seeded: 1,000 samples of 40 pairs per world, the one-sided 95% lower and upper bounds at every
    # look (10, 20, 30, 40 pairs); a run fails if any look's bound excludes the truth.
    for world, truth in (("skewed", -0.25), ("tied", -0.25), ("tied", -0.4), ("skewed-gains", 0.0)):
        rng = np.random.default_rng(11)
        a, b = paired_scores(rng, sims=1000, n=40, effect=effect_for(truth, world), world=world)
        d = a - b
        missed_low = np.zeros(len(d), dtype=bool)
        missed_high = np.zeros(len(d), dtype=bool)
        for n in (10, 20, 30, 40):
            missed_low |= lower_bounds(d[:, :n], scale=SCALE, alpha=0.05) > truth
            missed_high |= upper_bounds(d[:, :n], scale=SCALE, alpha=0.05) < truth
        # alpha 0.05 with the binomial error of 1,000 runs (0.007) twice over
        assert missed_low.mean() <= 0.064 and missed_high.mean() <= 0.064, (world, missed_low.mean(), missed_high.mean())


def test_a_clear_gain_is_found_and_its_claim_agrees_with_its_bound() -> None:
    rng = np.random.default_rng(3)
    a, b = paired_scores(rng, sims=400, n=44, effect=effect_for(0.5, "realistic"), world="realistic")
    d = a - b
    shown = claims(d, scale=SCALE, alpha=0.05, planned=44)
    assert shown.mean() >= 0.5  # most runs show a +0.5 gain on 44 pairs
    # The claim at 0 and the lower bound say the same thing (the bound is the largest rejected mean).
    low = lower_bounds(d, scale=SCALE, alpha=0.05, planned=44)
    agree = (low > 1e-9) == shown
    assert agree[np.abs(low) > 1e-6].all()
    # A gain of the widest kind on a few pairs is shown; a loss never is.
    assert claimed([2.0] * 20, scale=SCALE, alpha=0.05)
    assert not claimed([-1.0] * 40, scale=SCALE, alpha=0.05)


def test_a_difference_beyond_the_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        bound([5.0, 0.0], scale=SCALE, alpha=0.05)
    with pytest.raises(ValueError, match="scale"):
        bound([0.0], scale=(5.0, 1.0), alpha=0.05)
