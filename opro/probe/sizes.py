"""How many validation questions a claim needs, and what the held-out split detects (``opro plan``).

Both are read off the betting confidence sequence the validation stage and ``opro compare`` decide by
(:mod:`opro.stats.betting`), simulated at the planned paired sd (:func:`opro.stats.sequential.claim_rate`):

- **Questions needed.** Where the split cannot confirm the claim asked at 80% power (under
  the cost objective: a truly equal configuration shown not worse by the margin; under quality: a
  gain of :data:`QUALITY_GAIN`), the fewest validation questions with which it would, in the design in
  use (its looks on the split's confirmation questions, then one look on the questions beyond them,
  as the extension asks them), bisected up to :data:`MOST`. The questions beyond the split's and its
  unused ones are what ``opro dataset pool`` generates (:mod:`opro.data.pool`).
- **Passages.** Where questions share a source passage, the tests count passages (:class:`Clustering`):
  both figures are then computed on k passages of mean size m, a passage mean's sd from the paired sd
  and the within-passage correlation (measured by a comparison, else the worst case assumed).
- **Held-out detectable.** The smallest true difference ``opro compare`` finds on the held-out split
  at 80% power: its test in one look, bets tuned to the number of pairs (two-sided, or one-sided for
  ``--margin``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from opro.config import OproConfig
from opro.data.dataset import GoldenDataset
from opro.search.settings import ValidationSettings
from opro.search.validation_sizes import confirmation_looks
from opro.stats.sequential import claim_rate, design_power

#: The gain a quality claim is planned for (a half point on the 1-5 scale: what a better wording
#: usually gives where it helps, docs/benchmarks.md).
QUALITY_GAIN = 0.5
#: The most validation questions :func:`questions_needed` looks at; beyond, the plan says "more than".
MOST = 2000
#: The least rise of the claim rate over a doubling of the questions that keeps :func:`questions_needed`
#: looking (a rate that stopped rising is capped by something more questions do not change).
PLATEAU = 0.01
#: Runs simulated per size: the claim rate within about 0.01 at 80%, at a tenth of a second per size.
DRAWS = 2000


def questions_needed(
    looks_of: Callable[[int], Sequence[int]], *, gain: float, fewest: int, alpha: float, sd: float,
    scale: tuple[float, float], futility: bool = True, futility_confidence: float | None = None,
    power: float = 0.8, most: int = MOST, draws: int = DRAWS, seed: int = 0,
) -> int | None:
    """The fewest questions ``n`` from ``fewest`` to ``most`` at which the design with looks at
    ``looks_of(n)`` claims a true ``gain`` in ``power`` of the runs (None: not within ``most``).
    Doubled, then bisected: the claim rate grows with the questions (common random numbers over sizes)."""
    if fewest < 1 or most < fewest:
        raise ValueError(f"fewest ({fewest}) must be >= 1 and at most most ({most})")

    def rate(n: int) -> float:
        return claim_rate(looks_of(n), gain=gain, alpha=alpha, sd=sd, scale=scale, futility=futility,
                          futility_confidence=futility_confidence, draws=draws, seed=seed)

    def met(n: int) -> bool:
        return rate(n) >= power

    lo, hi, last = fewest - 1, fewest, -1.0  # not met at lo (or below the range), met at hi once found
    while (now := rate(hi)) < power:  # doubling first: the large sizes are the slow ones to simulate
        # Where doubling the questions no longer raises the rate, something else caps it (early looks'
        # futility stops): more questions will not reach the power.
        if hi == most or (last > 0 and now < last + PLATEAU):
            return None
        lo, hi, last = hi, min(2 * hi, most), now
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if met(mid) else (mid, hi)
    return hi


def heldout_detectable(n: int, *, alpha: float, sd: float, scale: tuple[float, float], sides: Literal[1, 2],
                       power: float = 0.8) -> float | None:
    """The smallest true paired difference ``opro compare`` shows on ``n`` held-out questions in ``power``
    of the runs: its betting test at ``alpha / sides`` a side, one look, bets tuned to ``n`` (``sides=1``:
    ``--margin``'s non-inferiority, a truly equal configuration shown within that difference). None: none."""
    if n < 1:
        return None
    return design_power([n], alpha=alpha / sides, sd=sd, scale=scale, futility=False, power=power).detectable


@dataclass(frozen=True)
class QuestionsNeeded:
    """What the validation stage would need to confirm the claim asked in 80% of runs, where the split
    falls short (``opro plan``)."""

    #: ``margin``: a truly equal configuration shown not worse by ``target`` (cost); ``gain``: a true
    #: gain of ``target`` claimed (quality).
    claim: Literal["gain", "margin"]
    target: float
    #: What the design as planned confirms (None: nothing), on ``have`` validation questions
    #: (selection, confirmation and the expected extension).
    confirms: float | None
    have: int
    #: Validation questions that would confirm ``target`` (None: more than ``most``).
    questions: int | None
    most: int
    #: Of them, beyond the split's and its unused questions: what ``opro dataset pool --pool`` is to
    #: generate (0: the dataset has them), and the ``[optimizer].validation_extension`` the extension
    #: needs to ask them all (None: the configured one does).
    pool: int | None
    extension: int | None
    #: True where only a larger validation split would confirm it (the extension's one look after the
    #: split's early looks cannot reach the power: those looks stop too many runs for futility).
    in_split: bool = False

    def text(self, *, pool_command: str) -> str:
        """The plan's line: what the split confirms, and how many questions would confirm the claim."""
        what = "a margin of" if self.claim == "margin" else "a gain of"
        have = "nothing" if self.confirms is None else f"{what} {self.confirms:.2f}"
        asked = f"the {self.target:g} asked" if self.claim == "margin" else f"a gain of +{self.target:g}"
        line = f"the split confirms {have} at 80% power on {self.have} validation questions; "
        if self.questions is None:
            return line + (f"more than {self.most:,} would be needed to confirm {asked}: lower the paired noise "
                           "(a steadier judge) or ask for a larger " + self.claim)
        line += f"{self.questions} validation questions would confirm {asked}"
        if self.in_split:
            return line + (" in a validation split of that size (`opro dataset split --validation`, the dataset "
                           "permitting): asked beyond the split, by the extension's last look, they stay short of 80% power, as the "
                           "split's early looks stop too many runs for futility")
        if self.pool:
            line += f": `{pool_command} --pool {self.pool}` generates the {self.pool} more"
        if self.extension is not None:
            line += f" ([optimizer].validation_extension = {self.extension} lets the stage ask them)"
        return line


def needed_for(design: ValidationSettings, *, selection: int, confirmation: int, unused: int, confirms: float | None,
               sd: float, scale: tuple[float, float], power: float = 0.8,
               clusters: Clustering | None = None) -> QuestionsNeeded | None:
    """:class:`QuestionsNeeded` of a validation stage with ``selection`` and ``confirmation`` questions in
    its split and ``unused`` questions in no split, which confirms ``confirms`` as planned; None where that
    reaches the claim asked. The questions beyond the split are asked as the extension asks them: one
    look after the split's looks. ``clusters``: the looks' tests count the validation split's passages
    (questions still counted in questions: passages x their mean size)."""
    rule = design.claim
    claim, target = rule.objective.target(margin=rule.margin, gain=QUALITY_GAIN)
    if confirmation < 1 or (confirms is not None and confirms <= target):
        return None

    def units(sizes: Sequence[int]) -> Sequence[int]:
        return sizes if clusters is None else clusters.scaled("validation", sizes, sd)[0]

    def looks_of(n: int) -> Sequence[int]:
        return units(confirmation_looks(replace(design, validation_extension=n - confirmation), confirmation,
                                        n - confirmation))

    def split_of(n: int) -> Sequence[int]:
        return units(confirmation_looks(design, n))

    sd = sd if clusters is None else clusters.scaled("validation", [], sd)[1]

    search = functools.partial(questions_needed, gain=target, fewest=confirmation, alpha=rule.alpha, sd=sd,
                               scale=scale, futility=design.futility, futility_confidence=rule.futility_confidence,
                               power=power, most=max(MOST - selection, confirmation))
    found = search(looks_of)
    in_split = found is None
    if in_split:
        found = search(split_of)
    beyond = None if found is None or in_split else found - confirmation
    return QuestionsNeeded(
        claim=claim, target=target, confirms=confirms,
        have=selection + confirmation + min(unused, design.validation_extension),
        questions=None if found is None else selection + found, most=MOST,
        pool=None if beyond is None else max(0, beyond - unused),
        extension=beyond if beyond is not None and beyond > design.validation_extension else None,
        in_split=in_split and found is not None)


def extendable(config: OproConfig, dataset: GoldenDataset) -> int:
    """The questions a validation extension of ``config``'s runs may ask on the split ``dataset``: its
    unused ones and the dataset's pool (:func:`opro.data.pool.extension_questions`)."""
    from opro.data.pool import extension_questions

    return len(extension_questions(dataset, config.pool_folder))


#: The within-passage correlation of paired differences a plan takes where nothing measured it: 1, the worst
#: case (a passage's questions count as one), so a clustered split is never planned as stronger than it is.
ASSUMED_RHO = 1.0
#: The fewest passages of two or more questions a comparison report must hold for its correlation to be taken.
MIN_SHARED = 5


@dataclass(frozen=True)
class Clustering:
    """How the validation and held-out questions group into source passages (:mod:`opro.stats.clusters`),
    and the within-passage correlation ``rho`` of paired differences the plan takes (``basis``: whose).
    The tests count passages: k clusters of mean size m, a cluster mean's sd sigma*sqrt((1+(m-1)*rho)/m)."""

    questions: Mapping[str, int]
    passages: Mapping[str, int]
    rho: float
    basis: str

    def size(self, split: str) -> float:
        """The mean questions per passage of ``split`` (1: a passage each, or no such split)."""
        k = self.passages.get(split, 0)
        return self.questions[split] / k if k else 1.0

    def scaled(self, split: str, sizes: Sequence[int], sd: float) -> tuple[list[int], float]:
        """``sizes`` (questions at each look) in passages of ``split``, and a passage mean's sd."""
        m = self.size(split)
        return [max(1, round(n / m)) for n in sizes], sd * math.sqrt((1 + (m - 1) * self.rho) / m)

    def line(self) -> str:
        shown = "; ".join(f"{self.questions[s]} {s} questions on {self.passages[s]} source passages"
                          for s in ("validation", "heldout") if self.passages.get(s, 0) < self.questions.get(s, 0))
        return (f"counted in passages, as the tests count them ({shown}), at within-passage correlation "
                f"{self.rho:.2f}: {self.basis}")


def clustering(config: OproConfig) -> Clustering | None:
    """The passages of the dataset at hand (the run's, else ``[data].dataset``; before a split, all its
    questions stand for either split), with the correlation measured by the newest comparison in the output
    folder that holds :data:`MIN_SHARED` passages of two or more, else :data:`ASSUMED_RHO`. None where every
    question is a passage of its own or no dataset is at hand yet."""
    from opro.data.dataset import load_dataset
    from opro.errors import OproError
    from opro.paths import RunDir
    from opro.stats.clusters import keys_of

    run = RunDir(config.output_dir)
    try:
        data = (load_dataset(run.dataset) if run.has_dataset()
                else load_dataset(config.data.dataset) if config.data.dataset else None)
    except (OproError, OSError):  # the run itself says what is wrong with the dataset
        return None
    if data is None:
        return None
    on = {s: data.examples_in(s) if data.split is not None else data.examples for s in ("validation", "heldout")}
    questions = {s: len(e) for s, e in on.items()}
    passages = {s: len(set(keys_of(e))) for s, e in on.items()}
    if passages == questions:
        return None
    measured = _measured_rho(run, {e.query: e for e in data.examples})
    rho, basis = measured if measured is not None else (
        ASSUMED_RHO, f"assumed, the worst case (nothing measured it yet: it lies between 0 and 1; `opro compare` on "
        f"{MIN_SHARED}+ shared passages measures it)")
    return Clustering(questions=questions, passages=passages, rho=rho, basis=basis)


def _measured_rho(run: Any, examples: Mapping[str, Any]) -> tuple[float, str] | None:
    """The within-passage correlation of the newest comparison's first prompt against its baseline, on the
    questions of this dataset, where it holds :data:`MIN_SHARED` passages of two or more (clamped to 0..1)."""
    import json
    from collections import Counter

    from opro.stats.clusters import keys_of, within_correlation

    for path in run.comparison_reports():
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            base = next(p for p in report["prompts"] if p["label"] == report["baseline"])
            other = next(p for p in report["prompts"] if p is not base)
        except (OSError, ValueError, KeyError, StopIteration, TypeError):
            continue
        kept = [(examples[q], a - b) for q, a, b in zip(report["questions"], other["scores"], base["scores"], strict=False)
                if a is not None and b is not None and q in examples]
        keys = keys_of([e for e, _ in kept])
        if sum(m > 1 for m in Counter(keys).values()) < MIN_SHARED:
            continue
        r = within_correlation([d for _, d in kept], keys)
        if not math.isnan(r):
            return min(1.0, max(0.0, r)), f"measured by {path.parent.name}'s comparison ({len(kept)} pairs)"
    return None


def pool_command(config: OproConfig) -> str:
    """The ``opro dataset pool`` command that adds questions to the dataset folder ``config``'s runs
    extend into: ``[data].dataset`` where it is a folder, else the run's own copy."""
    return f"opro dataset pool {config.pool_folder} " + (" ".join(f"--docs {config.resolve(x)}" for x in config.data.docs)
                                                          or "--docs <the documents it was made from>")


__all__ = ["ASSUMED_RHO", "DRAWS", "MOST", "PLATEAU", "QUALITY_GAIN", "Clustering", "QuestionsNeeded", "clustering", "extendable",
           "heldout_detectable", "needed_for", "pool_command", "questions_needed"]
