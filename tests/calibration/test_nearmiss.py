"""Near misses made from a reference without a model: one number changed, one name swapped, the first
sentence alone; seeded, and nothing where a kind does not apply."""

from __future__ import annotations

import re

import pytest

from opro.calibration.nearmiss import (
    NEAR_MISSES,
    change_number,
    find_names,
    find_numbers,
    first_sentence,
    name_pool,
    near_miss,
    near_misses,
    swap_name,
)

REFERENCES = [
    "AlexNet won the ImageNet challenge in 2012. It was designed by Alex Krizhevsky with Geoffrey Hinton.",
    "The top-5 error was 15.3%, about 10.8 points below the runner-up.",
    "It has 60,000,000 parameters and 650,000 neurons, trained on 2 GPUs for 6 days.",
    "Ilya Sutskever co-authored the paper at the University of Toronto.",
    "Dropout was applied in the first two fully connected layers.",
]


def _numbers(text: str) -> list[str]:
    return [text[a:b] for a, b in find_numbers(text)]


def test_one_number_changes_and_the_rest_stays() -> None:
    for seed in range(20):
        for ref in REFERENCES[:3]:
            changed = change_number(ref, seed=seed)
            assert changed is not None and changed != ref
            before, after = _numbers(ref), _numbers(changed)
            assert len(before) == len(after)
            assert sum(a != b for a, b in zip(before, after, strict=True)) == 1
            # Only the number moved: the words around it are the reference's.
            assert re.sub(r"[\d.,]+", "#", changed) == re.sub(r"[\d.,]+", "#", ref)


def test_changed_numbers_are_plausible() -> None:
    years = {change_number("It was published in 2012.", seed=s) for s in range(30)}
    assert years <= {f"It was published in {y}." for y in (2009, 2010, 2011, 2013, 2014, 2015)} and len(years) > 1
    assert all(re.fullmatch(r"It has \d{1,3}(,\d{3})+ parameters\.", change_number("It has 60,000,000 parameters.", seed=s) or "")
               for s in range(10))
    decimals = {change_number("The error was 15.3%.", seed=s) for s in range(10)}
    assert all(re.fullmatch(r"The error was \d+\.\d%\.", d or "") for d in decimals)
    assert "It used 0 GPUs." not in {change_number("It used 2 GPUs.", seed=s) for s in range(30)}


def test_number_is_deterministic_with_the_seed() -> None:
    ref = REFERENCES[2]
    assert change_number(ref, seed=3) == change_number(ref, seed=3)
    assert len({change_number(ref, seed=s) for s in range(10)}) > 1


def test_no_number_no_near_miss() -> None:
    for text in ("Dropout was applied twice.", "It runs on fp16 and 2D inputs with ResNet50.",
                 "Python 3.12.1 added it.", "1. Use a list.\n2. Then another.", "As shown in [124] and [3, 17]."):
        assert change_number(text, seed=0) is None, text


def test_names_are_capitalized_runs_not_opening_a_sentence() -> None:
    assert [n for _, _, n in find_names(REFERENCES[0])] == ["ImageNet", "Alex Krizhevsky", "Geoffrey Hinton"]
    # Two capitalized words opening a sentence are a name; common words are trimmed off.
    assert [n for _, _, n in find_names(REFERENCES[3])] == ["Ilya Sutskever", "University", "Toronto"]
    assert find_names("Dropout was applied. The layers were Dense.") == [(37, 42, "Dense")]
    assert find_names("It was fast. However it was big.") == []
    assert [n for _, _, n in find_names("A DRL-based agent beat ResNet-50 and Hinton's model.")] == ["DRL", "ResNet-50", "Hinton"]


def test_the_swapped_name_comes_from_another_reference_and_differs() -> None:
    pool = name_pool(REFERENCES)
    for seed in range(20):
        swapped = swap_name(REFERENCES[0], pool, seed=seed)
        assert swapped is not None and swapped != REFERENCES[0]
        own = {n for _, _, n in find_names(REFERENCES[0])}
        others = {n for ref in REFERENCES[1:] for _, _, n in find_names(ref)}
        new = {n for _, _, n in find_names(swapped)} - own
        gone = own - {n for _, _, n in find_names(swapped)}
        assert len(gone) == 1 and len(new) == 1 and new <= others
    assert swap_name(REFERENCES[0], pool, seed=1) == swap_name(REFERENCES[0], pool, seed=1)


def test_a_name_is_swapped_everywhere_it_occurs_for_one_of_the_same_shape() -> None:
    text = "It was built by Geoffrey Hinton; Geoffrey Hinton's lab trained it on a GPU."
    pool = ["Alex Krizhevsky", "Geoffrey Hinton", "CPU", "Toronto"]
    for seed in range(10):
        out = swap_name(text, pool, seed=seed)
        assert out is not None
        if "Geoffrey Hinton" not in out:
            assert out.count("Alex Krizhevsky") == 2  # the only other two-word name
        else:
            assert "GPU" not in out and "CPU" in out  # the only other capitals


def test_no_name_or_no_other_name_no_near_miss() -> None:
    assert swap_name("Dropout was applied in two layers.", ["Hinton"], seed=0) is None
    assert swap_name("It was Hinton.", ["Hinton"], seed=0) is None  # the pool holds only its own name
    assert swap_name("It was Hinton.", [], seed=0) is None


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("It won in 2012. It had 8 layers.", "It won in 2012."),
        ("Many tricks, e.g. dropout, helped. Then it won.", "Many tricks, e.g. dropout, helped."),
        ("It was funded in the U.S. by a grant. Then it won.", "It was funded in the U.S. by a grant."),
        ("The error fell to 3.5 points. That was large.", "The error fell to 3.5 points."),
        ("Dr. Hinton led it. Krizhevsky coded it.", "Dr. Hinton led it."),
        ("It was built by J. Smith in Toronto! It won.", "It was built by J. Smith in Toronto!"),
        ('He said "it works." Then it did.', 'He said "it works."'),
        ("1. Use a list.\n2. Then another.", "1. Use a list."),
        ("First paragraph without a stop\n\nSecond paragraph.", "First paragraph without a stop"),
    ],
)
def test_first_sentence(text: str, first: str) -> None:
    assert first_sentence(text) == first


@pytest.mark.parametrize(
    "text", ["It won in 2012.", "It won in 2012", "Many tricks, e.g. dropout, helped.", "It is approx. 3.5 m. ",
             "See the U.S. and the U.K. for more", "It won. ", "Wait... what"],
)
def test_one_sentence_no_near_miss(text: str) -> None:
    assert first_sentence(text) is None


def test_near_misses_of_a_dataset() -> None:
    made = near_misses(REFERENCES, seed=0)
    assert len(made) == len(REFERENCES)
    assert set(made[0]) == set(NEAR_MISSES)  # a number, names and two sentences
    assert set(made[4]) == set()  # no number, no name, one sentence
    assert set(made[3]) == {"name"}
    assert all(text != ref for m, ref in zip(made, REFERENCES, strict=True) for text in m.values())
    assert near_misses(REFERENCES, seed=0) == made
    # A reference's near misses do not depend on which other questions are sampled (pool fixed).
    assert near_misses(REFERENCES[:1], pool=REFERENCES, seed=0) == made[:1]
    assert near_misses(REFERENCES, seed=0, conditions=("number",))[1] == {"number": made[1]["number"]}
    with pytest.raises(ValueError, match="unknown near miss"):
        near_miss("typo", REFERENCES[0])
