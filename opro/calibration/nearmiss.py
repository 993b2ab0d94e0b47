"""Near-miss answers made from a reference answer without any model.

A near miss is the reference with one fact made wrong: what separates two good prompts is whether the
judge notices it. Three kinds, each a pure function of the text (and a seed) that returns ``None``
where it does not apply:

- ``number`` (:func:`change_number`): one number changed. A year (1000-2100, four digits) moves by 1-3;
  0-9 moves by 1-2 (not to 0); larger whole numbers and decimals are scaled by 0.5, 0.75, 1.25, 1.5 or 2 and rounded
  to the original's significant digits (whole numbers) or decimal places, keeping thousands separators.
  A number glued to letters (``fp16``, ``2D``, ``ResNet50``), a version with two or more dots
  (``3.12.1``), a list marker at a line's start (``1.``) and a citation (``[124]``) are not numbers here.
- ``name`` (:func:`swap_name`): one name swapped, everywhere it occurs, for a name from another
  reference. A name is a run of capitalized words (``Alex Krizhevsky``, ``ImageNet``, ``GPU``,
  ``ResNet-50``; ``DRL`` of ``DRL-based``) of two or more characters each, common capitalized words (``The``, ``However``, ...) trimmed off; a single
  capitalized word opening a sentence is not one (it may be any word). The new name is one the reference does not contain; one of the same shape (the
  number of words, all capitals or not) is preferred.
- ``first-sentence`` (:func:`first_sentence`): the reference cut to its first sentence. A sentence
  ends at ``.``, ``!`` or ``?`` (closing quotes and brackets kept) followed by white space and a
  character that is not lowercase, or at a blank line. A period does not end one after a known
  abbreviation (``e.g.``, ``Dr.``, ``approx.``, ...), a capital letter (``J. Smith``), a dotted acronym
  (``U.S.``), or a list marker; ``3.5`` has no white space after its period. ``U.S.`` at a sentence's
  end is therefore read as inside it (the cut is then later, or none).

Every random choice is drawn from a generator seeded by (seed, kind, reference text), so a near miss
depends only on its own reference, the seed and the pool of names: sampling more or fewer questions
leaves the others' near misses, and so their cached judge calls, as they were.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence

#: The near-miss conditions, in the order a calibration judges them.
NEAR_MISSES: tuple[str, ...] = ("number", "name", "first-sentence")


def _rng(seed: int, kind: str, text: str) -> random.Random:
    # A str seed is hashed with SHA-512: the same on every run and platform (no hash randomization).
    return random.Random(f"{seed}\x1f{kind}\x1f{text}")


# --- number --------------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?!\w)(?![.,]\d)")
_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0)


def find_numbers(text: str) -> list[tuple[int, int]]:
    """Where the numbers of ``text`` are (start, end), list markers at a line's start left out."""
    spans = []
    for m in _NUMBER.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not text[line_start:m.start()].strip() and text[m.end():m.end() + 1] in (".", ")") and not m.group(2):
            continue  # "1." / "2)" opening a line: a list marker
        if re.search(r"\[(?:\d+[,–-] ?)*$", text[:m.start()]) and re.match(r"(?:[,–-] ?\d+)*\]", text[m.end():]):
            continue  # "[124]", "[3, 7]": a citation
        spans.append((m.start(), m.end()))
    return spans


def _round_significant(value: float, digits: int) -> int:
    if value <= 0:
        return 0
    magnitude = len(str(round(value))) - digits
    step = 10 ** max(magnitude, 0)
    return int(round(value / step) * step)


def _other_number(token: str, rng: random.Random) -> str:
    """A plausible different number of the same kind as ``token`` (``"2012"``, ``"60,000"``, ``"3.5"``)."""
    whole, _, fraction = token.partition(".")
    commas = "," in whole
    if fraction:
        value = float(token.replace(",", ""))
        for factor in rng.sample(_FACTORS, len(_FACTORS)):
            new = f"{value * factor:,.{len(fraction)}f}" if commas else f"{value * factor:.{len(fraction)}f}"
            if new != token and float(new.replace(",", "")) > 0:
                return new
        return f"{value + 1:.{len(fraction)}f}"
    v = int(whole.replace(",", ""))
    if len(whole) == 4 and 1000 <= v <= 2100:  # a year
        return str(v + rng.choice((-3, -2, -1, 1, 2, 3)))
    if v < 10:
        return str(rng.choice([v + d for d in (-2, -1, 1, 2) if v + d >= (0 if v == 0 else 1)]))
    significant = max(len(str(v).rstrip("0")), 1)
    for factor in rng.sample(_FACTORS, len(_FACTORS)):
        new_value = _round_significant(v * factor, significant)
        if new_value not in (v, 0):
            return f"{new_value:,}" if commas else str(new_value)
    return f"{v + 1:,}" if commas else str(v + 1)


def change_number(text: str, *, seed: int = 0) -> str | None:
    """``text`` with one of its numbers (chosen with ``seed``) changed; None when it holds none."""
    spans = find_numbers(text)
    if not spans:
        return None
    rng = _rng(seed, "number", text)
    start, end = rng.choice(spans)
    return text[:start] + _other_number(text[start:end], rng) + text[end:]


# --- name ----------------------------------------------------------------------------------------

_WORD = r"[A-Z][A-Za-z0-9]*(?:-[A-Z0-9][A-Za-z0-9]*)*"
#: A name ends before a lowercase hyphenated tail ("DRL" of "DRL-based") and keeps a possessive's "'s".
_END_OF_NAME = r"(?!\w)(?!-[A-Z0-9])"
_NAME = re.compile(rf"(?<![\w'’-])({_WORD}(?: {_WORD})*){_END_OF_NAME}")
#: Capitalized words that are not names wherever they stand.
_COMMON_WORDS = (
    "A An The This That These Those There Their They It Its In On At By For From With Without Of To As "
    "If When While Where Which Who What Why How Yes No Not Both Each Every All Some Any Many Most Also "
    "However Therefore Thus Then So But And Or Nor Because Although Though Since After Before During "
    "Answer Question Note Example Here He She We You I"
)
_COMMON = frozenset(_COMMON_WORDS.split())


def _at_sentence_start(text: str, start: int) -> bool:
    before = text[:start].rstrip(" \t\"'“‘([*•-")
    return not before or before[-1] in ".!?\n"


def find_names(text: str) -> list[tuple[int, int, str]]:
    """The names of ``text`` (start, end, name): runs of capitalized words, common words (``The``,
    ``However``) trimmed from their ends; a single word opening a sentence is left out (a run of two or
    more there, ``Alex Krizhevsky designed``, is a name)."""
    out = []
    for m in _NAME.finditer(text):
        words = m.group(1).split(" ")
        starts = [m.start() + sum(len(w) + 1 for w in words[:k]) for k in range(len(words))]
        lo, hi = 0, len(words)
        while lo < hi and words[lo] in _COMMON:
            lo += 1
        while hi > lo and words[hi - 1] in _COMMON:
            hi -= 1
        kept = words[lo:hi]
        if not kept or any(len(w) < 2 for w in kept):
            continue
        if lo == 0 and len(kept) == 1 and _at_sentence_start(text, starts[0]):
            continue  # one capitalized word opening a sentence: a name or not, it cannot tell
        name = " ".join(kept)
        out.append((starts[lo], starts[lo] + len(name), name))
    return out


def name_pool(references: Iterable[str]) -> tuple[str, ...]:
    """Every distinct name in ``references``, sorted (the pool :func:`swap_name` draws from)."""
    return tuple(sorted({name for text in references for _, _, name in find_names(text)}))


def _shape(name: str) -> tuple[int, bool]:
    return len(name.split(" ")), name.replace(" ", "").isupper()


def swap_name(text: str, pool: Iterable[str], *, seed: int = 0) -> str | None:
    """``text`` with one of its names (chosen with ``seed``), everywhere it occurs, replaced by a name of
    ``pool`` (names of other references: :func:`name_pool`) that ``text`` does not contain; None when
    ``text`` has no name or the pool no usable one."""
    found = sorted({name for _, _, name in find_names(text)})
    if not found:
        return None
    lowered = text.lower()
    usable = sorted({p for p in pool if p.lower() not in lowered and p})
    if not usable:
        return None
    rng = _rng(seed, "name", text)
    old = rng.choice(found)
    alike = [p for p in usable if _shape(p) == _shape(old)] or usable
    new = rng.choice(alike)
    return re.sub(rf"(?<![\w'’-]){re.escape(old)}{_END_OF_NAME}", lambda _: new, text)


# --- first sentence ------------------------------------------------------------------------------

_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)|\n[ \t]*\n")
_ABBREVIATION_WORDS = (
    "e.g i.e eg ie vs cf al approx ca mr mrs ms dr prof st jr sr inc ltd co corp fig figs eq eqs no nos "
    "vol pp sec ch dept univ est jan feb mar apr jun jul aug sep sept oct nov dec"
)
_ABBREVIATIONS = frozenset(_ABBREVIATION_WORDS.split())


def _ends_sentence(text: str, m: re.Match[str]) -> bool:
    after = text[m.end():].lstrip()
    if not after or after[0].islower():
        return False
    mark = m.group(0)
    if mark.startswith("\n") or not mark.startswith(".") or mark.startswith(".."):
        return True
    word = re.search(r"(\S*)$", text[:m.start()])
    raw = (word.group(1) if word else "").lstrip("\"'“‘([")
    token = raw.lower()
    if token in _ABBREVIATIONS or re.fullmatch(r"[A-Z]|(?:[A-Za-z]\.)+[A-Za-z]", raw):
        return False  # e.g. / Dr. / J. Smith / U.S.
    line_start = text.rfind("\n", 0, m.start()) + 1
    return not (token.isdigit() and not text[line_start:m.start() - len(token)].strip())  # "1." list marker


def first_sentence(text: str) -> str | None:
    """The first sentence of ``text``; None when it has only one."""
    for m in _END.finditer(text):
        if _ends_sentence(text, m):
            first = text[:m.start() if m.group(0).startswith("\n") else m.end()].strip()
            if first and re.search(r"\w", text[m.end():]):
                return first
    return None


# --- all of them ---------------------------------------------------------------------------------


def near_miss(condition: str, reference: str, *, pool: Sequence[str] = (), seed: int = 0) -> str | None:
    """The ``condition`` near miss of ``reference`` (``pool``: names of other references, for ``name``)."""
    if condition == "number":
        return change_number(reference, seed=seed)
    if condition == "name":
        return swap_name(reference, pool, seed=seed)
    if condition == "first-sentence":
        return first_sentence(reference)
    raise ValueError(f"unknown near miss {condition!r}: use one of {', '.join(NEAR_MISSES)}")


def near_misses(
    references: Sequence[str], *, pool: Iterable[str] | None = None, seed: int = 0,
    conditions: Sequence[str] = NEAR_MISSES,
) -> list[Mapping[str, str]]:
    """Per reference, its near misses by condition (the ones that apply). Names are drawn from the
    names of ``pool`` (reference texts; default ``references``)."""
    names = name_pool(references if pool is None else pool) if "name" in conditions else ()
    out: list[Mapping[str, str]] = []
    for reference in references:
        made = {c: near_miss(c, reference, pool=names, seed=seed) for c in conditions}
        out.append({c: text for c, text in made.items() if text is not None and text != reference})
    return out


__all__ = [
    "NEAR_MISSES",
    "change_number",
    "find_names",
    "find_numbers",
    "first_sentence",
    "name_pool",
    "near_miss",
    "near_misses",
    "swap_name",
]
