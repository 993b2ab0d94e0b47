"""The OPRO meta-prompt: past instructions with scores, the task, exemplars; and candidate parsing.

Follows the reference OPRO-for-RAG notebook and the OPRO paper's reference implementation: the
best ``max_history`` pairs sorted ascending so the best come last, low scores dropped, a few
exemplars re-drawn each step, the answer wrapped in ``<INS>...</INS>`` (or brackets).
The notebook's flaw (it says scores range 1-5 and also describes 0/1 scoring) is fixed: the prompt
says what the score is, a judge's mean correctness grade.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_META_TEMPLATE = """\
Your task is to write an instruction for a question-answering assistant. Below are previous \
instructions with their scores. {score_description}

{history}

The instruction is placed where <INS> stands in this prompt, which is then given to the assistant:
{template}

Examples of questions and their expected answers (not the whole evaluation set):

{exemplars}

Write a new instruction that is different from the old ones and has a score as high as possible. \
It should tell the assistant how to answer; keep it to one to three sentences. {answer_format}"""

_ANSWER_FORMATS = {
    "ins": "Reply with the new instruction only, between <INS> and </INS>.",
    "brackets": "Write only the new instruction between square brackets, like [your instruction].",
}


@dataclass(frozen=True)
class ScoredInstruction:
    instruction: str
    score: float
    #: Stopped early by the pruner: ``score`` is a running mean over ``n_scored`` of ``n_total`` questions.
    partial: bool = False
    n_scored: int = 0
    n_total: int = 0
    #: Mean answer length (the task model's completion tokens), shown with the cost objective.
    answer_tokens: float | None = None


@dataclass(frozen=True)
class Exemplar:
    query: str
    answer: str
    #: Set for a failure (``exemplar_strategy = "failures"``): what the task model answered with the
    #: best instruction so far, its judge score and the judge's one-line reason.
    model_answer: str | None = None
    score: float | None = None
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.model_answer is not None


@dataclass(frozen=True)
class MetaPromptBuilder:
    """Renders meta-prompts. Settings here; history and exemplars come per call."""

    #: The QA template with ``<INS>`` where the instruction goes.
    template_text: str
    max_history: int = 20
    min_score: float = 0.0
    score_scale: Literal["1-5", "0-100"] = "1-5"
    answer_format: Literal["ins", "brackets"] = "ins"
    meta_template: str = DEFAULT_META_TEMPLATE
    max_exemplar_chars: int = 300
    #: Show each instruction's mean answer length beside its score (the cost objective),
    #: so the optimizer can propose wording that gets the same answers shorter.
    show_length: bool = False

    def select_history(self, history: Sequence[ScoredInstruction]) -> list[ScoredInstruction]:
        """Best ``max_history`` distinct instructions at or above ``min_score``, ascending (best last)."""
        best: dict[str, ScoredInstruction] = {}
        for item in history:
            if item.score < self.min_score:
                continue
            key = normalize_instruction(item.instruction)
            # A complete score outranks a partial one of the same instruction.
            if key not in best or (item.partial, -item.score) < (best[key].partial, -best[key].score):
                best[key] = item
        ranked = sorted(best.values(), key=lambda s: s.score, reverse=True)[: self.max_history]
        return sorted(ranked, key=lambda s: s.score)

    def format_score(self, score: float) -> str:
        if self.score_scale == "0-100":
            return str(round((score - 1.0) / 4.0 * 100))
        return f"{score:.2f}"

    def score_description(self) -> str:
        return self._score_description() + (
            " Each instruction also shows its answers' mean length in tokens: shorter answers cost less, so an "
            "instruction that keeps the score with shorter answers is better." if self.show_length else "")

    def _score_description(self) -> str:
        if self.score_scale == "0-100":
            return (
                "The score is a judge's mean correctness grade of the answers over an evaluation set, rescaled "
                "to 0 (every answer wrong) .. 100 (every answer fully correct). Higher is better."
            )
        return (
            "The score is a judge's mean correctness grade of the answers over an evaluation set, from 1 "
            "(wrong or irrelevant) to 5 (fully correct). Higher is better."
        )

    def render(self, *, history: Sequence[ScoredInstruction], exemplars: Sequence[Exemplar]) -> str:
        lines = [
            f"text:\n{item.instruction}\nscore:\n{self.format_score(item.score)}"
            + (f" (partial: stopped early after {item.n_scored} of {item.n_total} questions)" if item.partial else "")
            + (f"\nanswer length:\n{item.answer_tokens:.0f} tokens"
               if self.show_length and item.answer_tokens is not None else "")
            + "\n"
            for item in self.select_history(history)
        ]
        shown = []
        for ex in exemplars:
            text = (
                f"Question: {_clip(ex.query, self.max_exemplar_chars)}\n"
                f"Expected answer: {_clip(ex.answer, self.max_exemplar_chars)}\n"
            )
            if ex.failed:
                score = "" if ex.score is None else f", judged {ex.score:g} of 5"
                text += (
                    f"Answer given with the best instruction so far (wrong{score}): "
                    f"{_clip(ex.model_answer or '(empty)', self.max_exemplar_chars)}\n"
                )
                if ex.reason:
                    text += f"Why it is wrong: {_clip(ex.reason.splitlines()[0], 200)}\n"
            shown.append(text)
        return self.meta_template.format(
            score_description=self.score_description(),
            history="\n".join(lines) if lines else "(none yet)",
            template=_show_template(self.template_text),
            exemplars="\n".join(shown) if shown else "(none)",
            answer_format=_ANSWER_FORMATS[self.answer_format],
        )


def _show_template(template_text: str) -> str:
    """The QA template with readable slots: small optimizer models copy ``{context_str}`` verbatim."""
    return template_text.replace("{context_str}", "[retrieved context]").replace("{query_str}", "[question]").strip()


def draw_exemplars(pool: Sequence[Exemplar], *, k: int, step: int, seed: int) -> list[Exemplar]:
    """k exemplars for step ``step`` (1, 2, ...), drawn without replacement across steps while the pool
    lasts: the pool is shuffled (seeded) and the steps take consecutive slices of it; when it runs
    out, a new seeded shuffle starts. Reproducible from (seed, step) alone, so a resumed run draws
    the same exemplars. With k >= the pool size every step shows the whole pool."""
    items = list(pool)
    if k <= 0 or not items:
        return []
    if k >= len(items):
        return random.Random(f"{seed}:{step}").sample(items, len(items))
    start = max(0, step - 1) * k
    out: list[Exemplar] = []
    while len(out) < k:
        epoch, offset = divmod(start + len(out), len(items))
        order = random.Random(f"{seed}:epoch:{epoch}").sample(items, len(items))
        taken = {id(e) for e in out}
        candidate = order[offset]
        if id(candidate) in taken:  # a slice across two shuffles: skip what this step already shows
            start += 1
            continue
        out.append(candidate)
    return out


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


# -- candidate parsing and hygiene --------------------------------------------------------------

_INS_RE = re.compile(r"<INS>(.*?)(?:</INS>|$)", re.S | re.I)
_BRACKET_RE = re.compile(r"\[([^\[\]]{8,})\]", re.S)
_LABEL_RE = re.compile(
    r"^\s*(?:\*\*)?(?:new\s+)?(?:instruction|ins|prompt|answer)\s*(?:\(<?ins>?\))?\s*(?:\*\*)?\s*[:：-]\s*(?:\*\*)?\s*",
    re.I,
)
_TEMPLATE_VAR_RE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
# Chat around an untagged instruction: "Sure! Here's an improved instruction:", "Certainly.", "I suggest".
_CHAT_RE = re.compile(
    r"^\W*(?:sure|certainly|of course|okay|here(?:'s|’s| is| are)|below is|"
    r"i (?:suggest|propose|recommend|would|think|have)|i'(?:d|ve)|let me)\b",
    re.I,
)
# Several proposals on one line: "Option 2: ...", "Alternatively, ...".
_ALTERNATIVES_RE = re.compile(
    r"\b(?:option|alternative|instruction|version|candidate)\s*#?\s*[2-9]\b|\balternatively\b",
    re.I,
)


def extract_candidate(text: str, *, answer_format: Literal["ins", "brackets"] = "ins") -> str:
    """The instruction inside the optimizer's reply.

    Without tags: a labelled first line ("Instruction: ..."), or the one line a preamble ending in a
    colon introduces ("Sure! Here's an improved instruction:" then one line: the preamble is
    stripped), or the reply's lines kept one per line so that :func:`check_candidate` rejects
    several lines (alternatives, lists, commentary) and chat with a reason.
    """
    found = None
    if answer_format == "ins":
        matches = [m.strip() for m in _INS_RE.findall(text) if m.strip()]
        found = matches[0] if matches else None
    else:
        m = _BRACKET_RE.search(text)
        found = m.group(1) if m else None
    if found is not None:
        return clean_instruction(found)
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("```")
    ]
    if not lines:
        return ""
    labelled = [line for line in lines if _LABEL_RE.match(line) and clean_instruction(line)]
    if len(labelled) == 1 and labelled[0] == lines[0]:
        return clean_instruction(lines[0])  # "**New instruction:** X" then commentary: the label marks it
    if len(lines) == 2 and lines[0].endswith((":", "：")) and _CHAT_RE.match(lines[0]):
        return clean_instruction(lines[1])
    return "\n".join(clean_instruction(line) for line in lines)


def clean_instruction(text: str) -> str:
    """Strip wrappers models add: labels, quotes, code fences, markdown emphasis, stray tags."""
    t = text.strip()
    t = re.sub(r"</?INS>", "", t, flags=re.I).strip()
    t = t.strip("`").strip()
    t = _LABEL_RE.sub("", t).strip()
    for _ in range(2):
        if len(t) >= 2 and t[0] in "\"'“‘*" and t[-1] in "\"'”’*":
            t = t[1:-1].strip()
    return " ".join(t.split())


def normalize_instruction(text: str) -> str:
    """Key for duplicate detection: case, punctuation and spacing do not make a new instruction."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = re.sub(r"[^\w\s]", " ", t)
    return " ".join(t.split())


@dataclass(frozen=True)
class CandidateVerdict:
    instruction: str
    accepted: bool
    reason: str = ""


def check_candidate(instruction: str, *, seen: set[str], max_chars: int) -> CandidateVerdict:
    """Reject empty, over-long, duplicate, template-breaking, chatty and multi-proposal candidates.

    The reason is stored with the rejected candidate and shown to users.
    """
    if not instruction:
        return CandidateVerdict(instruction, False, "empty")
    if len(instruction) > max_chars:
        return CandidateVerdict(instruction, False, f"longer than {max_chars} characters")
    if _TEMPLATE_VAR_RE.search(instruction):
        return CandidateVerdict(instruction, False, "contains a template variable")
    if "{" in instruction or "}" in instruction:
        return CandidateVerdict(instruction, False, "contains braces that would break the template")
    if "\n" in instruction:
        lines = instruction.count("\n") + 1
        return CandidateVerdict(
            instruction,
            False,
            f"{lines} lines without <INS> tags (alternatives, a list or commentary), not one instruction",
        )
    if _CHAT_RE.match(instruction):
        return CandidateVerdict(instruction, False, f"chat, not an instruction: {instruction[:40]!r}")
    if _ALTERNATIVES_RE.search(instruction):
        return CandidateVerdict(instruction, False, "several alternative instructions in one reply")
    if normalize_instruction(instruction) in seen:
        return CandidateVerdict(instruction, False, "duplicate")
    return CandidateVerdict(instruction, True)


__all__ = [
    "DEFAULT_META_TEMPLATE",
    "CandidateVerdict",
    "Exemplar",
    "MetaPromptBuilder",
    "ScoredInstruction",
    "check_candidate",
    "clean_instruction",
    "draw_exemplars",
    "extract_candidate",
    "normalize_instruction",
]
