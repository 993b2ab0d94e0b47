"""experiments/bench_probe_verdicts.py: seeded pilots of a cheaper contrast truly worse than the initial
configuration, through the probe's own verdict_of and recommend."""

from __future__ import annotations

from bench_probe_verdicts import judged


def test_a_harmful_cheaper_contrast_is_never_inert_nor_cheaper_and_not_worse() -> None:
    """A true -0.4 contrast (integer scores, paired sd 0.8) was called "inert at the search's resolution" in
    0.188 of 20-question pilots where the search confirms only +0.6, and recommend then named it "cheaper and
    not worse" (93 of 500 pilots on earlier code). Over 200 seeded pilots: "hurts" or "undecided", never
    "inert", never named; the betting test sees the harm from about 40 pairs (42 of 200 there, 184 at 80)
    and calls none of the 20-pair pilots "hurts" (a bounded test cannot, on 20 pairs of this spread)."""
    for n, least_hurts in ((20, 0), (40, 20), (80, 150)):
        kinds: dict[str, int] = {}
        named = 0
        for seed in range(200):
            kind, cheaper = judged(seed, n=n, true=-0.4, band=0.25, margin=0.25, detectable=0.6)
            kinds[kind] = kinds.get(kind, 0) + 1
            named += cheaper
        assert set(kinds) <= {"hurts", "undecided"} and kinds.get("hurts", 0) >= least_hurts, (n, kinds)
        assert named == 0, (n, named)
