"""Questions that share a source passage are one cluster: their keys, the clustered test reducing to the
per-question one where no source is recorded, and refusing the claims that counting questions makes."""

from __future__ import annotations

import numpy as np

from opro.data.dataset import Example
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.stats.clusters import (
    cluster_keys,
    cluster_means,
    complete,
    counted,
    keys_of,
    looks_in_clusters,
    together,
    within_correlation,
)
from opro.stats.noninferiority import noninferiority
from opro.stats.paired import compare_paired
from opro.stats.sequential import decide
from opro.testing.score_worlds import cluster_layout, clustered_pairs

SCALE = (SCORE_MIN, SCORE_MAX)


def test_questions_on_the_same_passage_share_a_key_and_those_without_one_are_each_their_own() -> None:
    examples = [Example(query="When?", reference_answer="a", reference_contexts=("AlexNet won  ImageNet.", "x")),
                Example(query="Who?", reference_answer="a", reference_contexts=("alexnet won imagenet.",)),
                Example(query="Why?", reference_answer="a"),
                Example(query="Why?", reference_answer="a", reference_contexts=("  ",)),
                Example(query="How?", reference_answer="a", reference_contexts=("Another passage.",))]
    keys = keys_of(examples)
    assert keys[0] == keys[1] == "c:alexnet won imagenet."
    assert len({keys[0], keys[2], keys[3], keys[4]}) == 4  # the same question without a source: two clusters
    assert cluster_keys([(), ()]) == ("#0", "#1")


def test_a_clusters_questions_are_asked_together_and_count_once_complete() -> None:
    keys = ["a", "b", "a", "c", "b", "a"]
    assert together(keys) == [0, 2, 5, 1, 4, 3]
    planned = [keys[i] for i in together(keys)]  # a a a b b c
    assert complete(planned[:4], planned) == [True, True, True, False]
    assert looks_in_clusters((2, 3, 5, 6), planned) == (0, 1, 2, 3)
    # Ordered by completion: "b" completes (its last value) before "a".
    assert cluster_means([1.0, 2.0, 4.0, 0.0], ["a", "b", "b", "a"]).tolist() == [3.0, 0.5]
    assert together(["x", "y", "z"]) == [0, 1, 2]
    # A look counts the scored pairs of complete clusters: "b" lacks its second question, "a" one score.
    assert counted([4.0, None, 3.0, 5.0], [3.0, 3.0, 3.0, 1.0], planned) == ([1.0, 0.0], ["a", "a"])


def test_the_clustered_test_on_questions_without_sources_is_todays_exactly() -> None:
    rng = np.random.default_rng(3)
    a, b = (np.clip(np.round(rng.normal(3.4, 1.1, 40)), 1, 5) for _ in range(2))
    a = np.clip(a + (rng.random(40) < 0.3), 1, 5)
    keys = list(cluster_keys([()] * 40))
    d = (a - b).tolist()
    for seen in ([15], [15, 30], [15, 30, 40]):
        for shift in (0.0, 0.25):
            x = [v + shift for v in d[:seen[-1]]]
            today = decide(x, seen=seen[-1:], n_max=40, last=False, earlier=[], alpha=0.05, scale=SCALE, shift=shift)
            clustered = decide(x, seen=seen[-1:], n_max=40, last=False, earlier=[], alpha=0.05, scale=SCALE, shift=shift,
                               clusters=keys[:seen[-1]], planned_clusters=40)
            assert clustered == today
    assert compare_paired(a, b, scale=SCALE, clusters=keys) == compare_paired(a, b, scale=SCALE)
    assert (noninferiority(list(a), list(b), margin=0.25, alpha=0.05, scale=SCALE, clusters=keys)
            == noninferiority(list(a), list(b), margin=0.25, alpha=0.05, scale=SCALE))


def test_clusters_refuse_the_claims_that_counting_their_questions_makes() -> None:
    """Clusters of 2-6 questions whose differences are half shared (the clustered world at ICC 0.5) and a
    finalist worse by exactly the margin: counted as questions, non-inferiority is claimed well above
    alpha at 88 pairs; counted as clusters (the mean over them is the same truth), never above it."""
    rng = np.random.default_rng(11)
    n, margin = 88, 0.25
    keys = [str(c) for c in cluster_layout(n)]
    a, b = clustered_pairs(rng, (400, n), effect=-0.27, icc=0.5)  # about -0.25 after clipping
    per_question = [noninferiority(list(x), list(y), margin=margin, alpha=0.05, scale=SCALE).passed
                    for x, y in zip(a, b, strict=True)]
    per_cluster = [noninferiority(list(x), list(y), margin=margin, alpha=0.05, scale=SCALE, clusters=keys).passed
                   for x, y in zip(a, b, strict=True)]
    assert np.mean(per_question) > 0.08
    assert np.mean(per_cluster) <= 0.05


def test_the_within_cluster_correlation_is_the_share_of_variance_between_clusters() -> None:
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(2000), 3)
    shared = rng.normal(0, np.sqrt(0.4), 2000)[labels] + rng.normal(0, np.sqrt(0.6), 6000)
    independent = rng.normal(0, 1, 6000)
    keys = [str(x) for x in labels]
    assert abs(within_correlation(shared.tolist(), keys) - 0.4) < 0.05
    assert abs(within_correlation(independent.tolist(), keys)) < 0.05
    assert np.isnan(within_correlation([1.0, 2.0], ["a", "b"]))
