"""When two questions are the same: the leakage guard's notion of one question.

:func:`normalize_question` (case, Unicode, contractions), :func:`is_near_duplicate` and
:func:`same_question` (a near-duplicate by word overlap or edit ratio), :class:`QuestionKey` and
:class:`NearDuplicates` (the same, indexed for many questions). The splits
(:mod:`opro.data.dataset`) keep such questions together; compare and the held-out guard read them.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Set
from dataclasses import dataclass
from typing import Literal

# Contractions spelled out, so "What's" and "What is" normalize alike. "'s" is expanded only after
# words where it cannot be a possessive ("AlexNet's" stays a possessive).
_NOT = {"can't": "can not", "cannot": "can not", "won't": "will not", "shan't": "shall not", "ain't": "is not"}
_IS_WORDS = "what|who|where|when|why|how|which|it|that|there|here|he|she|this"
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'", "\u00b4": "'"})


def normalize_question(text: str) -> str:
    """The leakage guard's notion of 'same question'.

    NFKC, casefolded, contractions spelled out ("what's" = "what is", "isn't" = "is not"), and every
    punctuation mark, hyphen (any Unicode dash) and underscore read as a word break.
    """
    t = unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES)
    for short, full in _NOT.items():
        t = re.sub(rf"\b{short}\b", full, t)
    t = re.sub(r"n't\b", " not", t)
    t = re.sub(rf"\b({_IS_WORDS})'s\b", r"\1 is", t)
    t = re.sub(r"\blet's\b", "let us", t)
    for short, full in (("'re", " are"), ("'ve", " have"), ("'ll", " will"), ("'m", " am"), ("'d", " would")):
        t = re.sub(rf"(?<=\w){short}\b", full, t)
    return " ".join(re.findall(r"[^\W_]+", t))


def _tokens(text: str) -> set[str]:
    return set(normalize_question(text).split())


def is_near_duplicate(a: str, b: str, *, jaccard: float = 0.8, ratio: float = 0.9) -> bool:
    """Token Jaccard >= ``jaccard`` or character similarity >= ``ratio`` of the normalized questions."""
    return _near(_tokens(a), _tokens(b), normalize_question(a), normalize_question(b), jaccard=jaccard, ratio=ratio)


def _near(
    ta: Set[str], tb: Set[str], a: str, b: str, *, jaccard: float = 0.8, ratio: float = 0.9,
    matcher: difflib.SequenceMatcher[str] | None = None,
) -> bool:
    """:func:`is_near_duplicate` of texts whose normalized forms are ``a`` and ``b`` (token sets
    ``ta``, ``tb``); ``matcher``: one whose second sequence is already ``b`` (difflib keeps its
    index of that sequence between calls)."""
    if ta and tb and len(ta & tb) / len(ta | tb) >= jaccard:
        return True
    if matcher is None:
        matcher = difflib.SequenceMatcher(None, a, b)
    else:
        matcher.set_seq1(a)
    # The quick upper bounds skip most pairs cheaply when a whole dataset is compared pairwise.
    return matcher.real_quick_ratio() >= ratio and matcher.quick_ratio() >= ratio and matcher.ratio() >= ratio


def same_question(a: str, b: str) -> bool:
    """The split's and the held-out guard's relation: equal normalized text, or near-duplicates that
    name the same numbers ("Fact 1 about X?" and "Fact 2 about X?" are different questions; without
    this rule, templated questions chain into one group through the union-find)."""
    return QuestionKey.of(a).same_as(QuestionKey.of(b))


@dataclass(frozen=True)
class QuestionKey:
    """What :func:`same_question` reads of one question, computed once: a dataset compared pairwise
    would otherwise normalize each question six times per pair (seconds at 160 questions, a minute
    at 1,000)."""

    normal: str  # normalize_question(text)
    numbers: frozenset[str]
    # is_near_duplicate(normal, ...) normalizes its arguments once more: this is that text.
    again: str
    tokens: frozenset[str]

    @classmethod
    def of(cls, text: str) -> QuestionKey:
        normal = normalize_question(text)
        again = normalize_question(normal)
        return cls(
            normal=normal,
            numbers=frozenset(t for t in normal.split() if any(ch.isdigit() for ch in t)),
            again=again,
            tokens=frozenset(again.split()),
        )

    def same_as(self, other: QuestionKey, matcher: difflib.SequenceMatcher[str] | None = None) -> bool:
        """``same_question`` of the two texts (``matcher``: as for :func:`_near`)."""
        if self.normal == other.normal:
            return True
        if self.numbers != other.numbers:
            return False
        return _near(self.tokens, other.tokens, self.again, other.again, matcher=matcher)


class NearDuplicates:
    """Questions kept so far, each normalized once, to test a new one against all of them as
    :func:`is_near_duplicate` would (a generator checks every new question against every kept one)."""

    def __init__(self, *, jaccard: float = 0.8, ratio: float = 0.9) -> None:
        self.jaccard = jaccard
        self.ratio = ratio
        self._normal: set[str] = set()
        self._kept: list[tuple[str, frozenset[str], difflib.SequenceMatcher[str]]] = []

    def match(self, text: str) -> Literal["empty", "duplicate", "near-duplicate"] | None:
        """Why ``text`` is not new (empty once normalized, equal or near a kept one), or None."""
        normal = normalize_question(text)
        if not normal:
            return "empty"
        if normal in self._normal:
            return "duplicate"
        tokens = frozenset(normal.split())
        for kept, kept_tokens, matcher in self._kept:
            if _near(tokens, kept_tokens, normal, kept, jaccard=self.jaccard, ratio=self.ratio, matcher=matcher):
                return "near-duplicate"
        return None

    def add(self, text: str) -> None:
        normal = normalize_question(text)
        self._normal.add(normal)
        self._kept.append((normal, frozenset(normal.split()), difflib.SequenceMatcher(None, "", normal)))


__all__ = ["NearDuplicates", "QuestionKey", "is_near_duplicate", "normalize_question", "same_question"]
