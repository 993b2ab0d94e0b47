"""Simulated worlds of paired judge scores, with a known truth: the worlds in which every
paired test and interval of :mod:`opro.stats` is measured, by ``experiments/bench_compare_tests.py``,
``experiments/bench_selection.py`` and the package's tests (one definition for both).

No LLM is called; everything is numpy, seeded by the caller's generator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import numpy as np

World = Literal["rounded", "realistic", "measured", "t3", "skewed", "skewed-gains", "tied", "clustered", "rare"]
#: The worlds of issue 61, in which every test and interval is measured: integer 1-5 scores with ties
#: (``rounded``, ``realistic``), continuous scores at paired sd 0.66 (``measured``), heavy tails
#: (``t3``), and skewed differences in both directions (``skewed``: rare large losses of the prompt
#: tested, small gains elsewhere, the way a cost cut fails; ``skewed-gains``: rare large gains); and
#: ``tied``: the prompt tested scores exactly the same on most questions and loses (or gains) 2-3
#: points on a share of them, so that a sample of a few pairs is often all ties; ``clustered``: questions
#: come in clusters that share a source passage, and their paired differences move together.
WORLDS: tuple[World, ...] = ("rounded", "realistic", "measured", "t3", "skewed", "skewed-gains", "tied", "clustered")
#: The realistic world (bench_selection's uses the same numbers): a question is hard (level 1.7) or
#: easy (4.3), so scores are mostly 1-2 or 4-5; judge noise per call; a share of questions where
#: both prompts give the same answer (the same score); per-question effects of sd SPREAD around the
#: mean effect, so a better prompt still loses some questions.
HARD_SHARE, HARD_LEVEL, EASY_LEVEL, LEVEL_SD = 0.5, 1.7, 4.3, 0.5
REAL_NOISE_SD = 0.7
IDENTICAL_SHARE = 0.3
SPREAD = 1.0

#: ``measured`` (and bench_selection's ``--world measured``): the judge as measured on the embedded
#: stack, not assumed. The 11 equal-quality contrasts in docs/benchmarks.md (bench_headroom's 10 on 40
#: held-out AlexNet questions, both task models, every interval holding 0; the cost finalist's held-out
#: compare on 20) have paired-difference sds of 0.43 to 0.85, from each 95% interval's half-width h:
#: sd = h sqrt(n) / t(n-1). Their median is the world's default paired sd; 0.85, the largest, is its
#: harsh end. Their ties (identical verdicts) are 3-14 of 40, median 15%. Scores are continuous (the
#: logit judge's expected score) and questions differ by about a point, so the spread of one prompt's
#: scores stays about 1.1 while the pairing removes most of it.
MEASURED_SDS = (0.67, 0.44, 0.69, 0.83, 0.63, 0.47, 0.66, 0.70, 0.85, 0.53, 0.43)
MEASURED_LEVEL, MEASURED_LEVEL_SD, MEASURED_TIES = 3.3, 1.0, 0.15
PAIRED_SD = float(np.median(MEASURED_SDS))
#: ``skewed``: on FAIL_SHARE of the questions one prompt's answer fails (FAIL_LOSS points lower: the
#: passage not retrieved, the answer cut short); elsewhere it gains a little, so that the mean is the
#: effect; judge noise of paired sd SKEW_NOISE on top (continuous scores). The questions are mostly
#: answered well (level 3.6 to 4.4), so a failed answer (1.1 to 1.9) stays on the scale. With these
#: numbers today's sign-flip test claims non-inferiority at a true -0.25 in 0.20 / 0.13 / 0.09 of
#: samples at 10 / 20 / 44 pairs, as issue 61 measured.
FAIL_SHARE, FAIL_LOSS, SKEW_NOISE = 0.10, 2.5, 0.4
SKEW_LEVEL = (3.6, 4.4)
#: ``tied``: the way a cost cut usually fails (top_k 1 answers exactly as top_k 2 until the one passage
#: it needs is the second): integer scores, identical on most questions; on a share ``|effect| /
#: TIE_MOVE`` of them the prompt tested moves by 2 or 3 points (down for a negative effect, up for a
#: positive one), so the mean difference is ``effect`` exactly (-0.25: 1 question in 10; -0.4: 4 in 25).
TIE_MOVES = (2.0, 3.0)
TIE_MOVE = sum(TIE_MOVES) / len(TIE_MOVES)
#: ``clustered``: the questions come in clusters of 2, 3, 4, 5 and 6 (in turn: :func:`cluster_layout`), as
#: generated questions share their chunk; a paired difference is the effect, a shift shared by its
#: cluster (the passage retrieved or missed for all its questions) and its own noise, CLUSTER_ICC of the
#: paired variance CLUSTER_SD**2 shared; the initial prompt's level sits mid-scale (3 +- 0.4, symmetric,
#: so that equal prompts differ by 0 on average after clipping to 1-5). Continuous scores.
CLUSTER_SIZES = (2, 3, 4, 5, 6)
CLUSTER_ICC, CLUSTER_SD, CLUSTER_LEVEL_SD = 0.4, 1.0, 0.4
#: ``rare`` (intervals only): a score of 5, or 1 on RARE_SHARE of the questions, for either prompt.
RARE_SHARE = 0.1


def solve(increasing: Callable[[float], float], target: float, *, lo: float, hi: float, steps: int) -> float:
    """The x in [lo, hi] where the increasing function reaches ``target`` (bisection)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if increasing(mid) < target else (lo, mid)
    return (lo + hi) / 2


def measured_pairs(rng: np.random.Generator, n: int, *, shift: float, noise_sd: float,
                   tails: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (initial, other) score pairs of the measured world: a tie share scored identically, the rest
    with independent judge noise and the other configuration ``shift`` points off (before clipping).
    ``tails`` > 0: the noise is Student t with that many degrees of freedom, scaled by ``noise_sd``."""
    def noise() -> np.ndarray:
        return noise_sd * (rng.standard_t(tails, n) if tails else rng.normal(0, 1, n))

    level = MEASURED_LEVEL + rng.normal(0, MEASURED_LEVEL_SD, n)
    same = rng.random(n) < MEASURED_TIES
    a = level + noise()
    b = np.where(same, a, level + shift + noise())
    return np.clip(a, 1, 5), np.clip(b, 1, 5)


@functools.cache
def noise_for(paired_sd: float, tails: float = 0.0) -> float:
    """The per-answer judge noise whose paired differences (at equal quality) have sd ``paired_sd``."""
    def sd(noise: float) -> float:
        a, b = measured_pairs(np.random.default_rng(7), 200_000, shift=0.0, noise_sd=noise, tails=tails)
        return float(np.std(b - a))

    return solve(sd, paired_sd, lo=0.01, hi=3.0, steps=40)


def skewed_pairs(rng: np.random.Generator, shape: tuple[int, ...], *, effect: float,
                 gains: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) scores of the skewed world, a - b with mean about ``effect``: rare large losses of ``a``
    (``gains``: rare large losses of ``b``, so rare large gains of ``a``) and a small shift elsewhere."""
    level = rng.uniform(*SKEW_LEVEL, shape)
    fail = rng.random(shape) < FAIL_SHARE
    each = SKEW_NOISE / np.sqrt(2)
    # E[a - b] = effect: the failures move the mean by -/+ FAIL_SHARE * FAIL_LOSS, the rest by the remainder.
    rest = (effect + (-1 if gains else 1) * FAIL_SHARE * FAIL_LOSS) / (1 - FAIL_SHARE)
    a = level + np.where(fail, 0.0 if gains else -FAIL_LOSS, rest) + rng.normal(0, each, shape)
    b = level - np.where(fail, FAIL_LOSS if gains else 0.0, 0.0) + rng.normal(0, each, shape)
    return np.clip(a, 1, 5), np.clip(b, 1, 5)


def tied_pairs(rng: np.random.Generator, shape: tuple[int, ...], *, effect: float) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) integer scores of the tied world, a - b with mean exactly ``effect`` (|effect| <= TIE_MOVE)."""
    share = abs(effect) / TIE_MOVE
    if share > 1:
        raise ValueError(f"the tied world moves at most {TIE_MOVE:g} points on average, got {effect!r}")
    moved = rng.random(shape) < share
    move = rng.choice(TIE_MOVES, size=shape)
    # A moved question starts where the move stays on the scale: a loss from 4-5, a gain from 1-2.
    start = np.where(effect < 0, rng.integers(4, 6, shape), rng.integers(1, 3, shape)).astype(float)
    b = np.where(moved, start, rng.integers(1, 6, shape).astype(float))
    a = np.where(moved, start + np.sign(effect) * move, b)
    return a, b


def cluster_layout(n: int, sizes: tuple[int, ...] = CLUSTER_SIZES) -> np.ndarray:
    """The cluster of each of ``n`` questions in the clustered world: clusters of ``sizes`` in turn, each
    cluster's questions one after the other (the last one cut short at ``n``)."""
    each = np.resize(np.array(sizes), n // min(sizes) + 1)
    return np.repeat(np.arange(len(each)), each)[:n]


def clustered_pairs(rng: np.random.Generator, shape: tuple[int, ...], *, effect: float,
                    icc: float = CLUSTER_ICC, sizes: tuple[int, ...] = CLUSTER_SIZES) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) scores of the clustered world (questions of :func:`cluster_layout` along the last axis)."""
    labels = cluster_layout(shape[-1], sizes)
    shared = rng.normal(0, np.sqrt(icc) * CLUSTER_SD, (*shape[:-1], int(labels.max()) + 1))[..., labels]
    own = rng.normal(0, np.sqrt(1 - icc) * CLUSTER_SD, shape)
    level = 3.0 + rng.normal(0, CLUSTER_LEVEL_SD, shape)
    return np.clip(level + effect + shared + own, 1, 5), np.clip(level, 1, 5)


def scores(rng: np.random.Generator, n: int, effect: float, *, continuous: bool) -> tuple[np.ndarray, np.ndarray]:
    level = 3.0 + rng.normal(0, 0.6, n)
    a = level + effect + rng.normal(0, 0.9, n)
    b = level + rng.normal(0, 0.9, n)
    if continuous:  # an expected score: smooth, within 1..5
        return np.clip(a, 1, 5), np.clip(b, 1, 5)
    return np.clip(np.round(a), 1, 5), np.clip(np.round(b), 1, 5)


def paired_scores(rng: np.random.Generator, *, sims: int, n: int, effect: float,
                  world: World) -> tuple[np.ndarray, np.ndarray]:
    """``sims`` x ``n`` 1-5 scores of prompt A (better by ``effect`` judge points before rounding or
    clipping, on average over questions) and prompt B on the same questions (see :data:`WORLDS`)."""
    if world == "rounded":
        level = 3.0 + rng.normal(0, 0.6, (sims, n))
        a = level + effect + rng.normal(0, 0.9, (sims, n))
        b = level + rng.normal(0, 0.9, (sims, n))
        return np.clip(np.round(a), 1, 5), np.clip(np.round(b), 1, 5)
    if world in ("measured", "t3"):
        tails = 3.0 if world == "t3" else 0.0
        b, a = measured_pairs(rng, sims * n, shift=effect, noise_sd=noise_for(PAIRED_SD, tails), tails=tails)
        return a.reshape(sims, n), b.reshape(sims, n)
    if world in ("skewed", "skewed-gains"):
        return skewed_pairs(rng, (sims, n), effect=effect, gains=world == "skewed-gains")
    if world == "tied":
        return tied_pairs(rng, (sims, n), effect=effect)
    if world == "clustered":
        return clustered_pairs(rng, (sims, n), effect=effect)
    if world == "rare":
        a, b = (np.where(rng.random((sims, n)) < RARE_SHARE, 1.0, 5.0) for _ in range(2))
        return a, b
    hard = rng.random((sims, n)) < HARD_SHARE
    level = np.where(hard, HARD_LEVEL, EASY_LEVEL) + rng.normal(0, LEVEL_SD, (sims, n))
    same = rng.random((sims, n)) < IDENTICAL_SHARE
    # On the questions answered differently the shift is larger, so that its mean over all is ``effect``.
    shift = effect / (1 - IDENTICAL_SHARE) + SPREAD * rng.normal(size=(sims, n))
    b = np.clip(np.round(level + rng.normal(0, REAL_NOISE_SD, (sims, n))), 1, 5)
    a = np.clip(np.round(level + shift + rng.normal(0, REAL_NOISE_SD, (sims, n))), 1, 5)
    return np.where(same, b, a), b


def truth(effect: float, world: World) -> tuple[float, float]:
    """Prompt A's expected score and the expected difference A - B (400,000 questions)."""
    a, b = paired_scores(np.random.default_rng(99), sims=1, n=400_000, effect=effect, world=world)
    return float(a.mean()), float((a - b).mean())


@functools.cache
def effect_for(difference: float, world: World) -> float:
    """The ``effect`` whose expected difference A - B is ``difference`` (0 where the world is
    exchangeable at equal quality: every world but the skewed ones)."""
    if world == "tied":  # its mean difference is its effect, exactly
        return difference
    if difference == 0.0 and not world.startswith("skewed"):
        return 0.0
    return solve(lambda e: truth(e, world)[1], difference, lo=difference - 1.0, hi=difference + 1.0, steps=30)
