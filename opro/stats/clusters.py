"""Questions that share a source passage are one cluster: paired tests count clusters, not questions.

Generated datasets hold several questions per passage (history_of_alexnet: 80 passages of 2), and the
paired differences of questions on the same passage move together (the passage is retrieved or
missed for both). A test that counts them as independent overstates the evidence (Miller 2024,
"Adding error bars to evals", arXiv 2411.00640). Here a question's cluster is the normalized first
of its reference contexts (generated questions carry their chunk there); a question that records
none is a cluster of its own, so data without sources is tested exactly as before.

**The estimand is the mean over clusters** of each cluster's mean paired difference: each source
passage counts once, however many questions were written on it. A cluster's mean lies in the same
bounded range as a difference, and clusters are independent where passages are, so the betting
confidence sequence of :mod:`opro.stats.betting` applies to the cluster means unchanged. At a look
only **complete** clusters count (every question of the cluster that the design plans to ask has been
asked), taken in the order they complete: a fixed order set before any score is seen, of which the
complete clusters at every look are a prefix, so the looks stay those of one sequence. The validation
stage asks a cluster's questions one after the other (:func:`together`), so at most one cluster is
incomplete at a look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def cluster_keys(sources: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """Per question, its cluster: ``c:`` and its first non-blank source passage (whitespace collapsed,
    case folded), or ``#`` and its position where it records none (a cluster of its own)."""
    keys = []
    for i, contexts in enumerate(sources):
        first = next((" ".join(c.split()).casefold() for c in contexts if c.strip()), None)
        keys.append(f"#{i}" if first is None else f"c:{first}")
    return tuple(keys)


def keys_of(examples: Sequence[object]) -> tuple[str, ...]:
    """:func:`cluster_keys` of examples' ``reference_contexts`` (an example without the field records
    no source: a cluster of its own)."""
    return cluster_keys([tuple(getattr(e, "reference_contexts", ()) or ()) for e in examples])


def singletons(keys: Sequence[str]) -> bool:
    """Whether every cluster holds one question (the clustered test is then the per-question one)."""
    return len(set(keys)) == len(keys)


def together(keys: Sequence[str]) -> list[int]:
    """Positions in an order that keeps each cluster's questions one after the other, a cluster where
    its first question was (the identity when every cluster is a single question)."""
    members: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    return [i for group in members.values() for i in group]


def complete(asked: Sequence[str], planned: Sequence[str]) -> list[bool]:
    """Per asked question (a prefix of the ``planned`` order), whether its cluster is complete: every
    question of it that ``planned`` holds has been asked."""
    want: dict[str, int] = {}
    for k in planned:
        want[k] = want.get(k, 0) + 1
    have: dict[str, int] = {}
    for k in asked:
        have[k] = have.get(k, 0) + 1
    return [have[k] >= want.get(k, 0) for k in asked]


def counted(a: Sequence[float | None], b: Sequence[float | None], planned: Sequence[str]) -> tuple[list[float], list[str]]:
    """The paired differences ``a - b`` a look counts, with their clusters: both scored (not None) and
    their cluster complete (``a`` and ``b``: scores on the asked prefix of the ``planned`` order's clusters)."""
    done = complete(planned[:len(a)], planned)
    kept = [(x - y, k) for x, y, k, ok in zip(a, b, planned, done, strict=False) if ok and x is not None and y is not None]
    return [d for d, _ in kept], [k for _, k in kept]


def cluster_means(values: Sequence[float], keys: Sequence[str]) -> np.ndarray:
    """The mean of ``values`` per cluster, in the order the clusters complete (the position of each
    cluster's last value): the values themselves, in order, when every cluster is a single question."""
    if len(values) != len(keys):
        raise ValueError(f"{len(values)} values but {len(keys)} cluster keys")
    sums: dict[str, list[float]] = {}
    last: dict[str, int] = {}
    for i, (v, k) in enumerate(zip(values, keys, strict=True)):
        sums.setdefault(k, []).append(float(v))
        last[k] = i
    order = sorted(sums, key=last.__getitem__)
    return np.array([math.fsum(sums[k]) / len(sums[k]) for k in order], dtype=float)


def looks_in_clusters(sizes: Sequence[int], planned: Sequence[str]) -> tuple[int, ...]:
    """The complete clusters at each look of ``sizes`` questions asked in the ``planned`` order."""
    return tuple(len({k for k, done in zip(planned[:n], complete(planned[:n], planned), strict=True) if done})
                 for n in sizes)


def within_correlation(values: Sequence[float], keys: Sequence[str]) -> float:
    """The within-cluster correlation (one-way ANOVA intraclass correlation, ICC(1)) of ``values``: the
    share of their variance that lies between clusters, with the cluster sizes' effective mean ``n0``.
    0 where clusters are no more alike than any two questions; nan with no cluster of two or more."""
    groups: dict[str, list[float]] = {}
    for v, k in zip(values, keys, strict=True):
        groups.setdefault(k, []).append(float(v))
    sizes = np.array([len(g) for g in groups.values()], dtype=float)
    n, g = float(sizes.sum()), len(groups)
    if g < 2 or n <= g:
        return math.nan
    grand = float(np.mean([v for grp in groups.values() for v in grp]))
    between = sum(len(grp) * (float(np.mean(grp)) - grand) ** 2 for grp in groups.values()) / (g - 1)
    within = sum(float(np.sum((np.asarray(grp) - np.mean(grp)) ** 2)) for grp in groups.values()) / (n - g)
    n0 = (n - float((sizes ** 2).sum()) / n) / (g - 1)
    denominator = between + (n0 - 1) * within
    return math.nan if denominator == 0 else float((between - within) / denominator)


__all__ = ["cluster_keys", "cluster_means", "complete", "counted", "keys_of", "looks_in_clusters", "singletons", "together",
           "within_correlation"]
