"""Reading judge replies: the 1-5 score (:func:`parse_score`), the expected score from the score
token's logprobs, and the YES/NO verdict (:func:`parse_yes_no`). A parser never crashes and never
invents a score: a reply it cannot read is invalid, with the reason."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, NamedTuple

from opro.llm import Completion

SCORE_MIN = 1.0
SCORE_MAX = 5.0

OutputFormat = Literal["score_first", "result_tag", "score_label", "any"]

# --- score parsing ---------------------------------------------------------------------------------


class ParsedScore(NamedTuple):
    """``score`` in 1..5 or None; ``reason``: the judge's reasoning when valid, why not when invalid."""

    score: float | None
    reason: str


_NUM = r"(\d+(?:\.\d+)?)"
_SCALE = r"(?:\s*(?:/|out\s+of)\s*(\d+(?:\.\d+)?))?"
_RESULT_RE = re.compile(r"\[\s*RESULT\s*\]\s*[:=]?\s*[\(\[]?\s*" + _NUM + _SCALE, re.I)
# "Score: 4", "**Score:** 4", "Final score = 4/5", "Rating: 3": only at a line start, so prose such as
# "a fully correct answer would get a score of 5" is never read as the verdict.
_LABEL_RE = re.compile(
    r"^[\s*_#>`-]*(?:(?:final|overall)\s+)?(?:score|rating|grade)\s*(?:\*\*|__)?\s*(?:[:=]|is)\s*"
    r"(?:\*\*|__)?\s*[\(\[]?\s*" + _NUM + _SCALE,
    re.I | re.M,
)
# A line holding only a number (optionally decorated): "4", "4.0", "**4**", "4/5", "(3)".
_BARE_LINE_RE = re.compile(r"^[\s*_#>`\[\(]*" + _NUM + _SCALE + r"[\s*_`\]\).]*$", re.M)
_JSON_SCORE_RE = re.compile(r"\"score\"\s*:\s*\"?\s*(-?\d+(?:\.\d+)?)")
_FENCE_RE = re.compile(r"^```(?:json)?\s*|\s*```$", re.I)


def _check(value: str, scale: str | None, where: str) -> tuple[float | None, str | None]:
    try:
        score = float(value)
    except ValueError:
        return None, f"score {value!r} ({where}) is not a number"
    if scale is not None and float(scale) != SCORE_MAX:
        return None, f"score {value}/{scale} ({where}) is on a different scale than 1..5"
    if not math.isfinite(score) or not SCORE_MIN <= score <= SCORE_MAX:
        return None, f"score {value} ({where}) is outside 1..5"
    return score, None


def _parse_json(text: str) -> tuple[ParsedScore | None, int]:
    body = _FENCE_RE.sub("", text.strip())
    data: Any = None
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            data = None
    if isinstance(data, dict) and "score" in data:
        reasoning = str(data.get("reasoning") or data.get("feedback") or "")
        raw = data["score"]
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            return ParsedScore(None, f"JSON score {raw!r} is not a number"), -1
        score, why = _check(str(raw).strip(), None, "JSON")
        return (ParsedScore(score, reasoning) if why is None else ParsedScore(None, why)), -1
    # Truncated or malformed JSON ("max_tokens" cut the reasoning): still read the score field. The
    # last key wins here only after _conflict has ruled out two different scores in the reply.
    keys = list(_JSON_SCORE_RE.finditer(text))
    if keys and not _LABEL_RE.search(text) and not _RESULT_RE.search(text):
        m = keys[-1]
        score, why = _check(m.group(1), None, "JSON")
        return (ParsedScore(score, text.strip()) if why is None else ParsedScore(None, why)), m.start(1)
    return None, -1


def _conflict(text: str) -> str | None:
    """Why the reply is invalid when its labelled / JSON-key candidates name two different scores."""
    found: set[float] = set()
    for regex in (_RESULT_RE, _LABEL_RE, _JSON_SCORE_RE):
        for m in regex.finditer(text):
            scale = m.group(2) if regex is not _JSON_SCORE_RE else None
            score, why = _check(m.group(1), scale, "candidate")
            if why is None and score is not None:
                found.add(score)
    if len(found) > 1:
        listed = ", ".join(f"{v:g}" for v in sorted(found))
        return f"reply names different scores ({listed}); not guessing which one is the verdict"
    return None


def _locate(text: str, output_format: OutputFormat = "any") -> tuple[ParsedScore, int]:
    if not text or not text.strip():
        return ParsedScore(None, "empty reply"), -1
    parsed, pos = _parse_json(text)
    if parsed is not None and pos == -1:
        return parsed, pos  # a whole JSON object: its one score field is the verdict
    conflict = _conflict(text)
    if conflict is not None:
        return ParsedScore(None, conflict), -1
    if parsed is not None:
        return parsed, pos
    # Tiers, strongest first; within a tier the last match is the final verdict (reasoning may come
    # before it), except a score-first template whose verdict is its first bare line.
    tiers: list[tuple[str, list[re.Match[str]]]] = [
        ("[RESULT]", list(_RESULT_RE.finditer(text))),
        ("score label", list(_LABEL_RE.finditer(text))),
        ("bare number line", list(_BARE_LINE_RE.finditer(text))),
    ]
    if output_format == "score_first":
        # The template asked for the score on the first line: trust that line over later mentions.
        bare = tiers.pop(2)
        tiers.insert(0, bare)
    for where, matches in tiers:
        if not matches:
            continue
        m = matches[0] if (where == "bare number line" and output_format == "score_first") else matches[-1]
        score, why = _check(m.group(1), m.group(2), where)
        if why is not None:
            return ParsedScore(None, why), m.start(1)
        reasoning = (
            (text[: m.start()] + text[m.end() :]).strip() if where == "bare number line" else text.strip()
        )
        return ParsedScore(score, reasoning), m.start(1)
    return ParsedScore(None, f"no score found in reply: {text.strip()[:160]!r}"), -1


def parse_score(text: str, *, output_format: OutputFormat = "any") -> ParsedScore:
    """Read a 1-5 score from a judge reply; never raises.

    Accepts JSON ``{"score": N, "reasoning": ...}``, ``[RESULT] N``, ``Score: N`` (also markdown
    bold, ``N/5``) at a line start, and a line holding only the number; decimals such as 4.5 are
    kept. Scores mentioned inside prose do not count; a reply whose labels / JSON keys name two
    different scores is invalid rather than guessed. Out-of-range values (0, 7, 8/10) and replies without a
    score give ``ParsedScore(None, reason)``: never a made-up score.
    """
    return _locate(text, output_format)[0]


# --- side-by-side scores ------------------------------------------------------------------------------

_PAIR_KEY_RE = re.compile(r"\"score_(a|b)\"\s*:\s*\"?\s*(-?\d+(?:\.\d+)?)", re.I)
_PAIR_LABEL_RE = re.compile(r"^[\s*_#>`-]*(?:answer\s+)?(a|b)\s*(?:score)?\s*[:=]\s*[\(\[]?\s*" + _NUM + _SCALE, re.I | re.M)


class ParsedPair(NamedTuple):
    """The side-by-side judge's two scores (answer A, answer B), or None and why not."""

    scores: tuple[float, float] | None
    reason: str


def parse_pair_scores(text: str) -> ParsedPair:
    """Read ``{"score_a": N, "score_b": M}`` (or ``A: N`` / ``B: M`` lines) from a side-by-side reply;
    never raises. Both scores must be on 1..5; a reply naming two different scores for one answer, or
    only one of them, is invalid rather than guessed."""
    if not text or not text.strip():
        return ParsedPair(None, "empty reply")
    found: dict[str, set[float]] = {"a": set(), "b": set()}
    for regex, scaled in ((_PAIR_KEY_RE, False), (_PAIR_LABEL_RE, True)):
        for m in regex.finditer(text):
            score, why = _check(m.group(2), m.group(3) if scaled else None, f"score of answer {m.group(1).upper()}")
            if why is not None or score is None:
                return ParsedPair(None, why or "no score")
            found[m.group(1).lower()].add(score)
    for side in ("a", "b"):
        if not found[side]:
            return ParsedPair(None, f"no score for answer {side.upper()} in reply: {text.strip()[:160]!r}")
        if len(found[side]) > 1:
            listed = ", ".join(f"{v:g}" for v in sorted(found[side]))
            return ParsedPair(None, f"reply names different scores ({listed}) for answer {side.upper()}")
    return ParsedPair((found["a"].pop(), found["b"].pop()), text.strip())


# --- expected score from logprobs ------------------------------------------------------------------

_DIGITS = {str(i): float(i) for i in range(1, 6)}


def expected_score_from_logprobs(completion: Completion, score_char: int, score: float) -> float | None:
    """Sum of p(s)*s over s in 1..5 at the token that carries the score, renormalized over 1..5.

    The score token is found by rebuilding the reply from the most likely token at each step
    (temperature 0 makes it the emitted one); when that fails, the last step whose top token is
    the chosen score digit is used. Returns None when the backend gave no logprobs.
    """
    steps = completion.top_logprobs
    if not steps:
        return None
    target = str(int(score))
    index: int | None = None
    if score_char >= 0:
        offset = 0
        for i, alternatives in enumerate(steps):
            if not alternatives:
                break
            token = max(alternatives, key=lambda t: alternatives[t])
            if offset <= score_char < offset + len(token):
                index = i
                break
            offset += len(token)
    if index is None or not any(t.strip() in _DIGITS for t in steps[index]):
        candidates = [
            i for i, alt in enumerate(steps) if alt and max(alt, key=lambda t: alt[t]).strip() == target
        ]
        if not candidates:
            return None
        index = candidates[-1]
    probs: dict[float, float] = {}
    for token, logprob in steps[index].items():
        value = _DIGITS.get(token.strip())
        if value is not None:
            probs[value] = probs.get(value, 0.0) + math.exp(logprob)
    total = sum(probs.values())
    if total <= 0.0:
        return None
    return sum(v * p for v, p in probs.items()) / total


def score_distribution(completion: Completion) -> dict[int, float]:
    """``{score: probability}`` over 1..5 from a :meth:`~opro.llm.ChatClient.choose` completion
    (probabilities over the whole vocabulary: they sum to the mass the judge put on a score)."""
    steps = completion.top_logprobs or ()
    if not steps:
        return {}
    out: dict[int, float] = {}
    for token, logprob in steps[0].items():
        value = _DIGITS.get(token.strip())
        if value is not None:
            out[int(value)] = out.get(int(value), 0.0) + math.exp(logprob)
    return out


# --- YES/NO verdicts ---------------------------------------------------------------------------------

# A verdict word counts only where a verdict sits: after a label ("Verdict: NO because ..."), alone or
# followed by punctuation at a line start ("No, the context ..."), or closing a line ("... about it: YES").
# So "No doubt about it: YES" reads YES.
_DECOR = r"[\s*_#>`\"'-]*"
_YES_NO_RES = (
    re.compile(
        r"^" + _DECOR + r"(?:final\s+)?(?:answer|verdict|judge?ment)\s*[:=]" + _DECOR + r"(yes|no)\b",
        re.I | re.M,
    ),
    re.compile(r"^" + _DECOR + r"(yes|no)(?=[*_`\"']*\s*(?:[.,!:;)]|$))", re.I | re.M),
    re.compile(r"\b(yes|no)[*_`\"'.!)\s]*$", re.I | re.M),
)


def parse_yes_no(text: str) -> bool | None:
    """The YES/NO verdict of a reply (JSON ``{"answer": "YES"}`` too); None when there is none.

    Only anchored verdict words count (see ``_YES_NO_RES``); a reply with both an anchored YES and an
    anchored NO is invalid (None), never guessed.
    """
    body = _FENCE_RE.sub("", text.strip())
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            value = str(data.get("answer", data.get("verdict", ""))).strip().lower()
            if value in ("yes", "no"):
                return value == "yes"
    found = {m.group(1).lower() for regex in _YES_NO_RES for m in regex.finditer(text)}
    return None if len(found) != 1 else found == {"yes"}


#: ``"result": "yes"`` in MLflow's verdict format (:func:`parse_yes_no_verdict`).
_MLFLOW_RESULT_RE = re.compile(r'"result"\s*:\s*"\s*(yes|no)\s*"', re.I)


def parse_yes_no_verdict(text: str) -> tuple[bool | None, str]:
    """``(True/False, rationale)`` from MLflow's ``{"rationale": ..., "result": "yes|no"}`` reply; None if absent."""
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and str(data.get("result", "")).strip().lower() in ("yes", "no"):
        return str(data["result"]).strip().lower() == "yes", str(data.get("rationale", ""))
    found = {m.group(1).lower() for m in _MLFLOW_RESULT_RE.finditer(text)}
    if len(found) == 1:
        return found.pop() == "yes", text.strip()
    return None, text.strip()


__all__ = [
    "SCORE_MAX",
    "SCORE_MIN",
    "OutputFormat",
    "ParsedPair",
    "ParsedScore",
    "expected_score_from_logprobs",
    "parse_pair_scores",
    "parse_score",
    "parse_yes_no",
    "parse_yes_no_verdict",
    "score_distribution",
]
