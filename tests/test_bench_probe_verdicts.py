"""experiments/bench_probe_verdicts.py: seeded pilots of a cheaper contrast truly worse than the initial
configuration, through the probe's own verdict_of and recommend."""

from __future__ import annotations

from bench_probe_verdicts import judged


def test_a_harmful_cheaper_contrast_is_never_inert_nor_cheaper_and_not_worse() -> None:
    """Issue 61: a true -0.4 contrast (integer scores, paired sd 0.8) was called "inert at the search's
    resolution" in 0.188 of 20-question pilots where the search confirms only +0.6, and recommend then named
    it "cheaper and not worse" (93 of 500 pilots on the earlier code). Over 200 seeded pilots: "hurts" or
    "undecided", never "inert"; on 20 pilot pairs never named (the non-inferiority test needs 29), on 40
    named only as often as the test's error rate allows."""
    for n, most_named in ((20, 0), (40, 10)):
        kinds: dict[str, int] = {}
        named = 0
        for seed in range(200):
            kind, cheaper = judged(seed, n=n, true=-0.4, band=0.25, margin=0.25, detectable=0.6)
            kinds[kind] = kinds.get(kind, 0) + 1
            named += cheaper
        assert set(kinds) <= {"hurts", "undecided"} and kinds.get("hurts", 0) > 80, (n, kinds)
        assert named <= most_named, (n, named)
